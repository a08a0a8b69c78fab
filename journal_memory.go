package idem

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"iter"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/journal"
)

// MemoryJournal is a Journal held in process memory. It is NOT durable: a
// crash or a restart forgets every operation, so a retried operation after a
// restart gets a new key. Use it in tests, or when all you want is key reuse
// within one process's lifetime. Use OpenSQLite for anything that must
// survive a crash.
//
// The zero value is not usable; call NewMemoryJournal. A MemoryJournal is
// safe for concurrent use.
//
// A stored record is never changed in place: every write stores a new one
// (the rules return copies), so a record read under the lock may be copied
// for the caller, and a leased write's rules applied to it, after the lock
// is released. The lock is held only to look up, check and swap, which is
// what many goroutines calling at once wait for.
type MemoryJournal struct {
	mu      sync.Mutex
	closed  bool
	maxBody int
	now     func() time.Time
	seq     int64
	byKey   map[string]*memEntry
	byOp    map[scopeID]*memEntry
	// live and gone are the registered owners and those that unregistered:
	// in one process, an owner is gone exactly when it says so.
	live map[string]bool
	gone map[string]bool
}

type scopeID struct{ scope, id string }

type memEntry struct {
	seq int64 // insertion order, for List
	// rec is the record, but for its request's Header and its Response's,
	// which header and respHeader hold (see packedHeader).
	rec        Record
	header     packedHeader
	respHeader packedHeader
	gen        uint64 // counts the writes of rec, for Update's compare-and-swap
	history    []Event
	// events is the room of history's first two events, a create and the
	// outcome of a call that goes right: no allocation of their own.
	events [2]Event
}

// copyOf returns a copy of rec, e's record or one the rules made of it
// (sharing its request and Response), whose headers are packed.
func copyOf(rec Record, header, resp packedHeader) Record {
	out := journal.CloneRecord(rec)
	out.Header = header.header()
	if out.Response != nil {
		out.Response.Header = resp.header()
	}
	return out
}

// copy returns a copy of e's record. The caller holds m.mu.
func (e *memEntry) copy() Record { return copyOf(e.rec, e.header, e.respHeader) }

// packedHeader is a stored request's or response's header in one byte slice: the count
// of names and of values, then each name and its values, each a length and
// its bytes (a value count of 0 is a nil slice, n+1 otherwise). A journal
// that keeps every record keeps every header: as a map, it is a few
// objects with pointers (the map, its table, the values' array) that every
// garbage collection marks; as bytes, one that none scans.
type packedHeader []byte

func packHeader(h http.Header) packedHeader {
	if len(h) == 0 {
		return nil
	}
	size, values := 4, 0
	for k, vs := range h {
		size += len(k) + 2 + len(vs)
		for _, v := range vs {
			size += len(v) + 1
		}
		values += len(vs)
	}
	p := make([]byte, 0, size)
	p = binary.AppendUvarint(p, uint64(len(h)))
	p = binary.AppendUvarint(p, uint64(values))
	for k, vs := range h {
		p = binary.AppendUvarint(p, uint64(len(k)))
		p = append(p, k...)
		if vs == nil {
			p = append(p, 0)
			continue
		}
		p = binary.AppendUvarint(p, uint64(len(vs))+1)
		for _, v := range vs {
			p = binary.AppendUvarint(p, uint64(len(v)))
			p = append(p, v...)
		}
	}
	return p
}

// header returns a new http.Header with p's names and values: three
// allocations (the map, the values' array, one string they all share).
func (p packedHeader) header() http.Header {
	if len(p) == 0 {
		return nil
	}
	s := string(p)
	i := 0
	next := func() int {
		v, n := binary.Uvarint(p[i:])
		i += n
		return int(v)
	}
	str := func() string {
		n := next()
		i += n
		return s[i-n : i]
	}
	names, values := next(), next()
	h := make(http.Header, names)
	vals := make([]string, values)
	for range names {
		k := str()
		n := next()
		if n == 0 {
			h[k] = nil
			continue
		}
		vs := vals[: n-1 : n-1]
		vals = vals[n-1:]
		for j := range vs {
			vs[j] = str()
		}
		h[k] = vs
	}
	return h
}

// set stores rec as e's record.
func (e *memEntry) set(rec Record) {
	e.rec = rec
	e.gen++
}

var _ Journal = (*MemoryJournal)(nil)

// NewMemoryJournal returns an empty in-memory journal that accepts request
// bodies up to DefaultMaxBodySize.
func NewMemoryJournal() *MemoryJournal {
	return &MemoryJournal{
		maxBody: DefaultMaxBodySize,
		now:     time.Now,
		byKey:   make(map[string]*memEntry),
		byOp:    make(map[scopeID]*memEntry),
		live:    make(map[string]bool),
		gone:    make(map[string]bool),
	}
}

// MaxBodySize is the largest request body the journal accepts.
func (m *MemoryJournal) MaxBodySize() int { return m.maxBody }

// ownerGone reports whether owner registered and then unregistered. The
// caller holds m.mu.
func (m *MemoryJournal) ownerGone(owner string) bool { return m.gone[owner] }

func (m *MemoryJournal) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrJournalClosed
	}
	return nil
}

// Create implements Journal.
func (m *MemoryJournal) Create(ctx context.Context, rec Record) (Record, bool, error) {
	return m.create(ctx, rec, false, false, false)
}

// createShared is the client's Create (see createRecord): the record it
// returns when it creates one is the stored one, not a copy; with
// keepHeader its Header is rec's, with keepBody its Body.
func (m *MemoryJournal) createShared(ctx context.Context, rec Record, keepHeader, keepBody bool) (Record, bool, error) {
	return m.create(ctx, rec, true, keepHeader, keepBody)
}

func (m *MemoryJournal) create(ctx context.Context, rec Record, share, keepHeader, keepBody bool) (Record, bool, error) {
	header, body := rec.Header, rec.Body
	if keepHeader {
		rec.Header = nil // kept, not copied, once the record is valid
	}
	keepBody = keepBody && len(body) <= m.maxBody // else NewRecord refuses it
	if keepBody {
		rec.Body = nil
	}
	out, ev, err := journal.NewRecord(rec, m.now(), m.maxBody)
	if err != nil {
		return Record{}, false, err
	}
	if keepHeader && len(header) > 0 {
		out.Header = header
	}
	if keepBody && len(body) > 0 {
		out.Body = body
	}
	if err := m.lock(ctx); err != nil {
		return Record{}, false, err
	}
	if e, ok := m.byOp[scopeID{rec.Scope, rec.ID}]; ok {
		existing := e.copy()
		m.mu.Unlock()
		if existing.Fingerprint != rec.Fingerprint {
			return existing, false, journal.FingerprintMismatch(existing)
		}
		return existing, false, nil
	}
	stored := out
	stored.Header = nil
	e := &memEntry{seq: m.seq + 1, rec: stored, header: packHeader(out.Header)}
	e.events[0] = ev
	e.history = e.events[:1]
	// The key is stored without a lookup first, one hashing of it less
	// per Create: a map that did not grow had it already, under another
	// operation, which is put back (a scan, for a refused Create only).
	n := len(m.byKey)
	m.byKey[out.Key] = e
	if len(m.byKey) == n {
		for _, other := range m.byOp {
			if other.rec.Key == out.Key {
				m.byKey[out.Key] = other
				break
			}
		}
		m.mu.Unlock()
		return Record{}, false, fmt.Errorf("%w: %s", ErrDuplicateKey, out.Key)
	}
	m.seq++
	m.byOp[scopeID{out.Scope, out.ID}] = e
	m.mu.Unlock()
	if share {
		return out, true, nil
	}
	return journal.CloneRecord(out), true, nil
}

// Get implements Journal.
func (m *MemoryJournal) Get(ctx context.Context, key string) (Record, error) {
	if err := m.lock(ctx); err != nil {
		return Record{}, err
	}
	e, ok := m.byKey[key]
	var rec Record
	var header, resp packedHeader
	if ok {
		rec, header, resp = e.rec, e.header, e.respHeader
	}
	m.mu.Unlock()
	if !ok {
		return Record{}, journal.NotFound("key " + key)
	}
	return copyOf(rec, header, resp), nil
}

// Lookup implements Journal.
func (m *MemoryJournal) Lookup(ctx context.Context, scope, id string) (Record, error) {
	if err := m.lock(ctx); err != nil {
		return Record{}, err
	}
	e, ok := m.byOp[scopeID{scope, id}]
	var rec Record
	var header, resp packedHeader
	if ok {
		rec, header, resp = e.rec, e.header, e.respHeader
	}
	m.mu.Unlock()
	if !ok {
		return Record{}, journal.NotFound(scope + "/" + id)
	}
	return copyOf(rec, header, resp), nil
}

// Update implements Journal. Durability is ignored: nothing is durable here.
func (m *MemoryJournal) Update(ctx context.Context, rec Record, d Durability, why Event) (Record, error) {
	out, header, err := m.update(ctx, rec, d, why)
	if err != nil {
		return Record{}, err
	}
	out = journal.CloneRecord(out)
	out.Header = header.header()
	if out.Response != nil {
		out.Response.Header = cloneHeaderOf(rec.Response)
	}
	return out, nil
}

// updateShared is the client's Update (see createRecord): the record it
// returns shares its request with the stored one, and its Response is
// rec's own (the stored one is a copy of it).
func (m *MemoryJournal) updateShared(ctx context.Context, rec Record, d Durability, why Event) (Record, error) {
	out, _, err := m.update(ctx, rec, d, why)
	if err != nil {
		return Record{}, err
	}
	// The request is the client's record's, as stored: its header is the
	// one the client has.
	out.Header = rec.Header
	if out.Response != nil && rec.Response != nil {
		// The stored Response is a copy of rec's, field for field (the
		// rules' cloneResponse): rec's is the same answer.
		out.Response = rec.Response
	}
	return out, nil
}

// cloneHeaderOf returns a copy of r's header.
func cloneHeaderOf(r *Response) http.Header {
	if r == nil || len(r.Header) == 0 {
		return nil
	}
	return r.Header.Clone()
}

// update stores rec's write and returns the stored record, which the
// caller must copy before handing it on, and whose Response, if any, has
// no Header: rec's is the one stored (packed); nor has its request, whose
// Header update returns packed.
func (m *MemoryJournal) update(ctx context.Context, rec Record, d Durability, why Event) (Record, packedHeader, error) {
	if err := journal.CheckDurability(d); err != nil {
		return Record{}, nil, err
	}
	// The rules copy the rest of the response; its header is packed here,
	// not copied into a map.
	var packed packedHeader
	if rec.Response != nil && rec.Response.Header != nil {
		packed = packHeader(rec.Response.Header)
		resp := *rec.Response
		resp.Header = nil
		rec.Response = &resp
	}
	for {
		if err := m.lock(ctx); err != nil {
			return Record{}, nil, err
		}
		e, ok := m.byKey[rec.Key]
		if !ok {
			m.mu.Unlock()
			return Record{}, nil, journal.NotFound("key " + rec.Key)
		}
		if rec.Lease.Owner == "" {
			// An unleased write's rules ask whether the lease's owner
			// is gone, which the lock guards.
			out, ev, err := journal.ApplyUpdate(e.rec, rec, m.now(), why, m.ownerGone)
			if err == nil {
				e.set(out)
				e.respHeader = packed
				e.history = append(e.history, ev)
			}
			m.mu.Unlock()
			if err != nil {
				return Record{}, nil, err
			}
			return out, e.header, nil
		}
		stored, gen := e.rec, e.gen
		m.mu.Unlock()
		// A leased write's rules need nothing but the stored record.
		out, ev, err := journal.ApplyUpdate(stored, rec, m.now(), why, nil)
		if err != nil {
			return Record{}, nil, err
		}
		if err := m.lock(ctx); err != nil {
			return Record{}, nil, err
		}
		if m.byKey[rec.Key] != e || e.gen != gen {
			m.mu.Unlock()
			continue // written (or pruned) meanwhile: judge the write again
		}
		e.set(out)
		e.respHeader = packed
		e.history = append(e.history, ev)
		header := e.header
		m.mu.Unlock()
		return out, header, nil
	}
}

// Claim implements Journal.
func (m *MemoryJournal) Claim(ctx context.Context, req ClaimRequest) ([]Record, error) {
	if err := journal.CheckClaimRequest(req); err != nil {
		return nil, err
	}
	if err := m.lock(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	now := m.now()
	var due []*memEntry
	for _, e := range m.byKey {
		if journal.Claimable(e.rec, now, req.DueBy, m.ownerGone) && (req.Scope == "" || e.rec.Scope == req.Scope) &&
			strings.HasPrefix(e.rec.URL, req.URLPrefix) {
			due = append(due, e)
		}
	}
	slices.SortFunc(due, func(a, b *memEntry) int {
		return cmp.Or(a.rec.NextAttemptAt.Compare(b.rec.NextAttemptAt), cmp.Compare(a.seq, b.seq))
	})
	var out []Record
	for _, e := range due[:min(len(due), req.Limit)] {
		rec, ev, err := journal.ApplyClaim(e.rec, req.Owner, req.Lease, now, m.ownerGone)
		if err != nil {
			return nil, err
		}
		e.set(rec)
		e.history = append(e.history, ev)
		out = append(out, copyOf(rec, e.header, e.respHeader))
	}
	return out, nil
}

// Acquire implements Journal.
func (m *MemoryJournal) Acquire(ctx context.Context, key, owner string, lease time.Duration) (Record, error) {
	if err := m.lock(ctx); err != nil {
		return Record{}, err
	}
	defer m.mu.Unlock()
	e, ok := m.byKey[key]
	if !ok {
		return Record{}, journal.NotFound("key " + key)
	}
	rec, ev, err := journal.ApplyClaim(e.rec, owner, lease, m.now(), m.ownerGone)
	if err != nil {
		return e.copy(), err
	}
	e.set(rec)
	e.history = append(e.history, ev)
	return copyOf(rec, e.header, e.respHeader), nil
}

// Renew implements Journal.
func (m *MemoryJournal) Renew(ctx context.Context, held map[string]Lease, lease time.Duration) (int, error) {
	if err := m.lock(ctx); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	now := m.now()
	n := 0
	for key, l := range held {
		e, ok := m.byKey[key]
		if !ok {
			continue
		}
		if rec, renewed := journal.ApplyRenew(e.rec, l, lease, now); renewed {
			e.set(rec)
			n++
		}
	}
	return n, nil
}

// Register implements Journal: the owner is gone once it unregisters.
func (m *MemoryJournal) Register(ctx context.Context, owner string) (func() error, error) {
	if owner == "" {
		return nil, fmt.Errorf("%w: Register needs an owner name", ErrInvalidRecord)
	}
	if err := m.lock(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	if m.live[owner] || m.gone[owner] {
		return nil, fmt.Errorf("%w: owner %q registered before; each registration needs a new name", ErrInvalidRecord, owner)
	}
	m.live[owner] = true
	var once sync.Once
	return func() error {
		once.Do(func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			delete(m.live, owner)
			m.gone[owner] = true
		})
		return nil
	}, nil
}

// Sync implements Journal; nothing here is ever durable.
func (m *MemoryJournal) Sync(ctx context.Context) error {
	if err := m.lock(ctx); err != nil {
		return err
	}
	m.mu.Unlock()
	return nil
}

// Release implements Journal.
func (m *MemoryJournal) Release(ctx context.Context, key string, l Lease) error {
	if err := m.lock(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	e, ok := m.byKey[key]
	if !ok {
		return journal.NotFound("key " + key)
	}
	rec, err := journal.ApplyRelease(e.rec, l, m.now())
	if err != nil {
		return err
	}
	e.set(rec)
	return nil
}

// List implements Journal. It copies the matching records under the lock,
// which is what memory allows.
func (m *MemoryJournal) List(ctx context.Context, f Filter) iter.Seq2[Record, error] {
	return func(yield func(Record, error) bool) {
		if err := m.lock(ctx); err != nil {
			yield(Record{}, err)
			return
		}
		var after int64 = -1
		if f.After != "" {
			e, ok := m.byKey[f.After]
			if !ok {
				m.mu.Unlock()
				yield(Record{}, journal.CursorNotFound(f.After))
				return
			}
			after = e.seq
		}
		var match []*memEntry
		for _, e := range m.byKey {
			if e.seq > after && f.Match(e.rec) {
				match = append(match, e)
			}
		}
		slices.SortFunc(match, func(a, b *memEntry) int { return cmp.Compare(a.seq, b.seq) })
		recs := make([]Record, len(match))
		for i, e := range match {
			recs[i] = e.copy()
		}
		m.mu.Unlock()
		for _, r := range recs {
			if err := ctx.Err(); err != nil {
				yield(Record{}, err)
				return
			}
			if !yield(r, nil) {
				return
			}
		}
	}
}

// Count implements Journal.
func (m *MemoryJournal) Count(ctx context.Context) ([]Count, error) {
	if err := m.lock(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	type group struct {
		scope string
		state State
	}
	counts := map[group]*Count{}
	for _, e := range m.byKey {
		g := group{e.rec.Scope, e.rec.State}
		c, ok := counts[g]
		if !ok {
			c = &Count{Scope: g.scope, State: g.state, Oldest: e.rec.CreatedAt}
			counts[g] = c
		}
		c.N++
		if e.rec.CreatedAt.Before(c.Oldest) {
			c.Oldest = e.rec.CreatedAt
		}
	}
	out := make([]Count, 0, len(counts))
	for _, c := range counts {
		out = append(out, *c)
	}
	journal.SortCounts(out)
	return out, nil
}

// History implements Journal.
func (m *MemoryJournal) History(ctx context.Context, key string) ([]Event, error) {
	if err := m.lock(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	e, ok := m.byKey[key]
	if !ok {
		return nil, journal.NotFound("key " + key)
	}
	return slices.Clone(e.history), nil
}

// Prune implements Journal.
func (m *MemoryJournal) Prune(ctx context.Context, before time.Time) (int, error) {
	if err := m.lock(ctx); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	n := 0
	for k, e := range m.byKey {
		if journal.Prunable(e.rec, before) {
			delete(m.byKey, k)
			delete(m.byOp, scopeID{e.rec.Scope, e.rec.ID})
			n++
		}
	}
	return n, nil
}

// Close implements Journal.
func (m *MemoryJournal) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}
