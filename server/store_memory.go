package server

import (
	"context"
	"encoding/binary"
	"net/http"
	"sync"
	"time"
)

// MemoryStore is a Store in process memory: nothing survives a restart, and
// it cannot be shared between processes. Use it for tests and for a single
// instance whose clients can live with a restart forgetting every key.
// It is safe for concurrent use. Create it with NewMemoryStore.
type MemoryStore struct {
	mu        sync.Mutex
	entries   map[scopedKey]memEntry
	lastToken int64
}

type scopedKey struct{ scope, key string }

// memEntry is an Entry as the store keeps it, in the map itself: the
// response is one encoded byte slice (encodeResponse) rather than a header
// map of string slices. Every entry stays live for the retention, and the
// garbage collector marks each live entry on every cycle: a header map is a
// handful of objects with pointers to scan, a byte slice one object with
// none.
type memEntry struct {
	fingerprint, method, path string
	state                     EntryState
	token                     int64
	createdAt, lockedAt       time.Time
	expiresAt                 time.Time
	response                  []byte // encodeResponse; nil while in progress
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{entries: make(map[scopedKey]memEntry)}
}

// Claim implements Store.
func (s *MemoryStore) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return ClaimResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := scopedKey{req.Scope, req.Key}
	e, ok := s.entries[k]
	switch {
	case !ok || !e.expiresAt.After(req.Now):
		s.lastToken++
		e = memEntry{
			fingerprint: req.Fingerprint, method: req.Method, path: req.Path, state: InProgress, token: s.lastToken,
			createdAt: req.Now, lockedAt: req.Now, expiresAt: req.ExpiresAt,
		}
		s.entries[k] = e
		return ClaimResult{Claimed: true, Token: e.token, Entry: e.entry(k)}, nil
	case e.state == InProgress && e.fingerprint == req.Fingerprint && e.lockedAt.Before(req.StaleBefore):
		s.lastToken++
		e.token, e.lockedAt = s.lastToken, req.Now
		e.expiresAt = later(e.expiresAt, req.ExpiresAt)
		s.entries[k] = e
		return ClaimResult{Claimed: true, TookOver: true, Token: e.token, Entry: e.entry(k)}, nil
	}
	return ClaimResult{Entry: e.entry(k)}, nil
}

// Complete implements Store.
func (s *MemoryStore) Complete(ctx context.Context, req CompleteRequest) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// Encoded outside the lock: it copies the response, which the caller
	// may change once Complete has returned.
	resp := encodeResponse(req.Response)
	s.mu.Lock()
	defer s.mu.Unlock()
	k := scopedKey{req.Scope, req.Key}
	e, ok := s.entries[k]
	if ok && e.state == Completed && e.token == req.Token && sameResponse(decodeResponse(e.response), req.Response) {
		// The same completion again: the first one's reply was lost.
		return nil
	}
	if !ok || e.state != InProgress || e.token != req.Token {
		return ErrLockLost
	}
	e.state, e.response, e.expiresAt = Completed, resp, req.ExpiresAt
	s.entries[k] = e
	return nil
}

// Release implements Store.
func (s *MemoryStore) Release(ctx context.Context, scope, key string, token int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := scopedKey{scope, key}
	e, ok := s.entries[k]
	if !ok || e.state != InProgress || e.token != token {
		return ErrLockLost
	}
	delete(s.entries, k)
	return nil
}

// Renew implements Store.
func (s *MemoryStore) Renew(ctx context.Context, scope, key string, token int64, now time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := scopedKey{scope, key}
	e, ok := s.entries[k]
	if !ok || e.state != InProgress || e.token != token {
		return ErrLockLost
	}
	e.lockedAt = now
	s.entries[k] = e
	return nil
}

// Get implements Store.
func (s *MemoryStore) Get(ctx context.Context, scope, key string, now time.Time) (Entry, error) {
	if err := ctx.Err(); err != nil {
		return Entry{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := scopedKey{scope, key}
	e, ok := s.entries[k]
	if !ok || !e.expiresAt.After(now) {
		return Entry{}, ErrNotFound
	}
	return e.entry(k), nil
}

// Sweep implements Store.
func (s *MemoryStore) Sweep(ctx context.Context, now time.Time) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, e := range s.entries {
		if !e.expiresAt.After(now) {
			delete(s.entries, k)
			n++
		}
	}
	return n, nil
}

// Len returns the number of entries held, expired ones included until they
// are swept.
func (s *MemoryStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries)
}

// entry returns e as an Entry of its own, the response decoded.
func (e *memEntry) entry(k scopedKey) Entry {
	return Entry{
		Scope: k.scope, Key: k.key, Fingerprint: e.fingerprint, Method: e.method, Path: e.path,
		State: e.state, Token: e.token, CreatedAt: e.createdAt, LockedAt: e.lockedAt, ExpiresAt: e.expiresAt,
		Response: decodeResponse(e.response),
	}
}

// encodeResponse packs a response into one byte slice: the status, the
// number of header fields, each field's name and values, then the body,
// every length and count a uvarint.
func encodeResponse(r *StoredResponse) []byte {
	n := 2*binary.MaxVarintLen64 + len(r.Body)
	for k, vs := range r.Header {
		n += 2*binary.MaxVarintLen64 + len(k)
		for _, v := range vs {
			n += binary.MaxVarintLen64 + len(v)
		}
	}
	b := make([]byte, 0, n)
	b = binary.AppendUvarint(b, uint64(r.Status))
	b = binary.AppendUvarint(b, uint64(len(r.Header)))
	for k, vs := range r.Header {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return append(b, r.Body...)
}

// decodeResponse reads what encodeResponse wrote into a response of the
// caller's own (nil for nil), its header's values sharing one backing
// array.
func decodeResponse(b []byte) *StoredResponse {
	if b == nil {
		return nil
	}
	next := func() int {
		v, n := binary.Uvarint(b)
		b = b[n:]
		return int(v)
	}
	str := func() string {
		n := next()
		s := string(b[:n])
		b = b[n:]
		return s
	}
	r := &StoredResponse{Status: next()}
	if fields := next(); fields > 0 {
		r.Header = make(http.Header, fields)
		for range fields {
			k := str()
			vs := make([]string, next())
			for i := range vs {
				vs[i] = str()
			}
			r.Header[k] = vs
		}
	}
	r.Body = append([]byte{}, b...)
	return r
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
