package redis

import goredis "github.com/redis/go-redis/v9"

// Each operation of the store is one Lua script on the entry's one Redis
// key, run with EVALSHA (and EVAL when the server's script cache lost it):
// one round trip, atomic with respect to every other command on the key,
// in every process that shares the Redis.
//
// The entry is a hash:
//
//	s   state: 1 in progress, 2 completed, 0 released (a tombstone that
//	    keeps the last token, see token below)
//	t   the fencing token, decimal
//	f   the fingerprint; m, p the method and path
//	c   created, l locked, e expires: instants, see below
//	n   the nonce of the last claim, completion or release, so that the
//	    same call, sent again by the client after its reply was lost, is
//	    recognised as itself rather than refused as a foreign one
//	rs, rh, rb   the response: status, header (wire.EncodeHeader), body
//
// Instants are 20 decimal digits: 11 of Unix seconds, 9 of nanoseconds.
// Lua numbers are doubles, exact to 2^53 only, which nanoseconds since 1970
// exceed; the two halves are each exact, so scripts compare and shift
// instants as (seconds, nanoseconds) pairs and the comparisons are exact
// at the precision the middleware passes.
//
// Under the server clock (the default) the scripts read the instant from
// Redis's TIME and apply the caller's durations (lock timeout, retention)
// to it; under the caller clock they take the caller's instants as given.
// Either way a script returns the instant it judged by ("now"), so that the
// store can report the entry's instants in the caller's frame.
//
// The first write of every script is an HSET, which Redis refuses when it
// is out of memory (maxmemory): Redis checks memory at a script's first
// write only, so a script either changes nothing or runs to its end.
const prelude = `
local function split(x) return tonumber(string.sub(x, 1, 11)), tonumber(string.sub(x, 12, 20)) end
local function fmt(s, n) return string.format('%011d%09d', s, n) end
local function before(a, b)
  local as, an = split(a)
  local bs, bn = split(b)
  if as ~= bs then return as < bs end
  return an < bn
end
local function shift(x, ds, dn)
  local s, n = split(x)
  s, n = s + ds, n + dn
  if n >= 1000000000 then s, n = s + 1, n - 1000000000 elseif n < 0 then s, n = s - 1, n + 1000000000 end
  return fmt(s, n)
end
local function millis(a, b)
  local as, an = split(a)
  local bs, bn = split(b)
  local d = (bs - as) * 1000 + math.ceil((bn - an) / 1000000)
  if d < 1 then d = 1 end
  return d
end
local clock = redis.call('TIME')
local micros = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local function servernow() return fmt(tonumber(clock[1]), tonumber(clock[2]) * 1000) end
local key = KEYS[1]
`

// claimScript: ARGV = mode, fingerprint, method, path, nonce, then under
// the server clock the lock timeout and the retention as (seconds,
// nanoseconds), under the caller clock now, stale-before and expires.
//
// Tokens are the greater of the last token plus one and Redis's clock in
// microseconds: strictly increasing per key while the entry (or its
// release's tombstone) lives, and, once it expired, still greater than any
// token handed out for the key before, unless Redis's clock went back by
// more than the retention.
var claimScript = goredis.NewScript(prelude + `
local fp, method, path, nonce = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local now, stale, expires
if ARGV[1] == 'S' then
  now = servernow()
  stale = shift(now, -tonumber(ARGV[6]), -tonumber(ARGV[7]))
  expires = shift(now, tonumber(ARGV[8]), tonumber(ARGV[9]))
else
  now, stale, expires = ARGV[6], ARGV[7], ARGV[8]
end
local e = redis.call('HMGET', key, 's', 't', 'f', 'm', 'p', 'c', 'l', 'e', 'rs', 'rh', 'rb', 'n')
local function reply(code)
  return {code, now, e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], e[9], e[10], e[11]}
end
local function token()
  local t = (tonumber(e[2]) or 0) + 1
  if t < micros then t = micros end
  return string.format('%d', t)
end
local state = e[1]
if state == '1' and e[12] == nonce then
  return reply('mine')
end
if (state ~= '1' and state ~= '2') or not before(now, e[8]) then
  local tok = token()
  redis.call('HSET', key, 's', '1', 't', tok, 'f', fp, 'm', method, 'p', path, 'c', now, 'l', now, 'e', expires, 'n', nonce)
  -- A new key has no response to drop: one call fewer on the common path.
  if e[9] then redis.call('HDEL', key, 'rs', 'rh', 'rb') end
  redis.call('PEXPIRE', key, millis(now, expires))
  e = {'1', tok, fp, method, path, now, now, expires, false, false, false}
  return reply('new')
end
if state == '1' and e[3] == fp and before(e[7], stale) then
  local tok = token()
  local exp = e[8]
  if before(exp, expires) then exp = expires end
  redis.call('HSET', key, 't', tok, 'l', now, 'e', exp, 'n', nonce)
  redis.call('PEXPIRE', key, millis(now, exp))
  e[2], e[7], e[8] = tok, now, exp
  return reply('took')
end
return reply('seen')
`)

// completeScript: ARGV = mode, token, nonce, then the expiry (server
// clock: the retention as seconds, nanoseconds; caller clock: the instant
// and an empty string), status, header, body. Under the caller clock the
// TTL counts from the lock's last renewal, the last instant of the
// caller's that the entry holds.
var completeScript = goredis.NewScript(prelude + `
local token, nonce = ARGV[2], ARGV[3]
local e = redis.call('HMGET', key, 's', 't', 'l', 'n')
if e[2] ~= token then return 'lost' end
if e[1] == '2' then
  if e[4] == nonce then return 'ok' end
  -- The same completion sent again by the middleware, after the reply to
  -- the first was lost: it changes nothing and succeeds.
  local r = redis.call('HMGET', key, 'rs', 'rh', 'rb')
  if r[1] == ARGV[6] and r[2] == ARGV[7] and r[3] == ARGV[8] then return 'ok' end
  return 'lost'
end
if e[1] ~= '1' then return 'lost' end
local now, expires
if ARGV[1] == 'S' then
  now = servernow()
  expires = shift(now, tonumber(ARGV[4]), tonumber(ARGV[5]))
else
  now, expires = e[3], ARGV[4]
end
redis.call('HSET', key, 's', '2', 'e', expires, 'n', nonce, 'rs', ARGV[6], 'rh', ARGV[7], 'rb', ARGV[8])
redis.call('PEXPIRE', key, millis(now, expires))
return 'ok'
`)

// releaseScript: ARGV = mode, token, nonce. The entry becomes a tombstone
// that keeps its token and its TTL, so that the next claim's token is
// greater.
var releaseScript = goredis.NewScript(prelude + `
local token, nonce = ARGV[2], ARGV[3]
local e = redis.call('HMGET', key, 's', 't', 'n')
if e[2] ~= token then return 'lost' end
if e[1] == '0' and e[3] == nonce then return 'ok' end
if e[1] ~= '1' then return 'lost' end
redis.call('HSET', key, 's', '0', 'n', nonce)
redis.call('HDEL', key, 'f', 'm', 'p', 'c', 'l', 'rs', 'rh', 'rb')
return 'ok'
`)

// renewScript: ARGV = mode, token, now (caller clock).
var renewScript = goredis.NewScript(prelude + `
local e = redis.call('HMGET', key, 's', 't')
if e[1] ~= '1' or e[2] ~= ARGV[2] then return 'lost' end
local now = ARGV[3]
if ARGV[1] == 'S' then now = servernow() end
redis.call('HSET', key, 'l', now)
return 'ok'
`)

// getScript: ARGV = mode, now (caller clock). It writes nothing.
var getScript = goredis.NewScript(prelude + `
local now = ARGV[2]
if ARGV[1] == 'S' then now = servernow() end
local e = redis.call('HMGET', key, 's', 't', 'f', 'm', 'p', 'c', 'l', 'e', 'rs', 'rh', 'rb')
if (e[1] ~= '1' and e[1] ~= '2') or not before(now, e[8]) then return {'none', now} end
return {'seen', now, e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], e[9], e[10], e[11]}
`)

// sweepScript (caller clock only): ARGV = now. It deletes the entry if it
// expired by now, and returns 1 if it was an entry (not a tombstone).
var sweepScript = goredis.NewScript(prelude + `
local e = redis.call('HMGET', key, 's', 'e')
if not e[2] or before(ARGV[1], e[2]) then return 0 end
redis.call('DEL', key)
if e[1] == '1' or e[1] == '2' then return 1 end
return 0
`)
