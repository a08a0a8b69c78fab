package server

import (
	"context"
	"sync"
	"time"
)

// MemoryStore is a Store in process memory: nothing survives a restart, and
// it cannot be shared between processes. Use it for tests and for a single
// instance whose clients can live with a restart forgetting every key.
// It is safe for concurrent use. Create it with NewMemoryStore.
type MemoryStore struct {
	mu        sync.Mutex
	entries   map[scopedKey]*Entry
	lastToken int64
}

type scopedKey struct{ scope, key string }

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{entries: make(map[scopedKey]*Entry)}
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
	case !ok || e.expired(req.Now):
		s.lastToken++
		e = &Entry{
			Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint,
			Method: req.Method, Path: req.Path, State: InProgress, Token: s.lastToken,
			CreatedAt: req.Now, LockedAt: req.Now, ExpiresAt: req.ExpiresAt,
		}
		s.entries[k] = e
		return ClaimResult{Claimed: true, Token: e.Token, Entry: *e}, nil
	case e.takeable(&req):
		s.lastToken++
		e.Token, e.LockedAt = s.lastToken, req.Now
		e.ExpiresAt = later(e.ExpiresAt, req.ExpiresAt)
		return ClaimResult{Claimed: true, TookOver: true, Token: e.Token, Entry: *e}, nil
	}
	return ClaimResult{Entry: e.copy()}, nil
}

// Complete implements Store.
func (s *MemoryStore) Complete(ctx context.Context, req CompleteRequest) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[scopedKey{req.Scope, req.Key}]
	if !ok || e.State != InProgress || e.Token != req.Token {
		return ErrLockLost
	}
	e.State, e.Response, e.ExpiresAt = Completed, req.Response.Clone(), req.ExpiresAt
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
	if !ok || e.State != InProgress || e.Token != token {
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
	e, ok := s.entries[scopedKey{scope, key}]
	if !ok || e.State != InProgress || e.Token != token {
		return ErrLockLost
	}
	e.LockedAt = now
	return nil
}

// Get implements Store.
func (s *MemoryStore) Get(ctx context.Context, scope, key string, now time.Time) (Entry, error) {
	if err := ctx.Err(); err != nil {
		return Entry{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[scopedKey{scope, key}]
	if !ok || e.expired(now) {
		return Entry{}, ErrNotFound
	}
	return e.copy(), nil
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
		if e.expired(now) {
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

func (e *Entry) copy() Entry {
	c := *e
	c.Response = e.Response.Clone()
	return c
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
