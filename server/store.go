package server

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"net/http"
	"slices"
	"time"
)

// Errors a Store returns, matched with errors.Is.
var (
	// ErrNotFound: the store holds no live entry for the scope and key
	// (never claimed, released, swept, or past its expiry).
	ErrNotFound = errors.New("idempotency entry not found")
	// ErrLockLost: the caller's fencing token no longer holds the entry's
	// lock. Another request took the entry over after the lock went stale,
	// or the entry was released or completed: the caller must not store its
	// response.
	ErrLockLost = errors.New("idempotency lock lost to another request")
	// ErrUnstorable: the store cannot keep this request's scope, key or
	// route, whenever it is asked (a value longer than it can hold, say).
	// A Store's Claim wraps it in an error that says what it cannot keep
	// and why, without the value itself. The middleware then answers 400
	// with that reason and runs nothing, rather than 503, which would
	// invite the same request again. Every store in this module and in
	// package postgres keeps any value, so none returns it.
	ErrUnstorable = errors.New("the idempotency store cannot keep this request")
)

// EntryState is the state of a stored entry.
type EntryState int

// Entry states.
const (
	// InProgress: a request claimed the key and its handler has not
	// finished (or died without finishing).
	InProgress EntryState = iota + 1
	// Completed: the handler's response is stored.
	Completed
)

func (s EntryState) String() string {
	switch s {
	case InProgress:
		return "in_progress"
	case Completed:
		return "completed"
	}
	return "invalid"
}

// StoredResponse is a response as the middleware stores and replays it.
type StoredResponse struct {
	// Status is the HTTP status code.
	Status int
	// Header holds the handler's headers, without Set-Cookie.
	Header http.Header
	// Body is the whole body; never nil once stored.
	Body []byte
}

// Clone returns a deep copy, so that a store never shares memory with its
// callers.
func (r *StoredResponse) Clone() *StoredResponse {
	if r == nil {
		return nil
	}
	body := make([]byte, len(r.Body))
	copy(body, r.Body)
	return &StoredResponse{Status: r.Status, Header: r.Header.Clone(), Body: body}
}

// Entry is what a store holds for one (scope, key).
type Entry struct {
	// Scope and Key identify the entry: the caller's scope and the
	// unquoted key.
	Scope string
	Key   string
	// Fingerprint identifies the request that claimed the key: a digest of
	// its method, path, query and body. Stores compare it for equality only.
	Fingerprint string
	// Method and Path are the route the key was first used on, reported to
	// a caller that reuses the key elsewhere.
	Method string
	Path   string
	// State is InProgress or Completed.
	State EntryState
	// Token is the fencing token of the current lock holder. Only a
	// Complete, Release or Renew carrying it changes the entry.
	Token int64
	// CreatedAt is when the key was first claimed; LockedAt when the
	// current holder claimed it or last renewed its lock.
	CreatedAt time.Time
	LockedAt  time.Time
	// ExpiresAt is when the entry stops counting: from then on it reads as
	// absent, a claim replaces it, and Sweep deletes it.
	ExpiresAt time.Time
	// Response is set once the entry is Completed.
	Response *StoredResponse
}

// ClaimRequest asks a store to take a key for one request.
type ClaimRequest struct {
	// Scope and Key identify the entry.
	Scope, Key string
	// Fingerprint, Method and Path describe the request; they become the
	// new entry's.
	Fingerprint  string
	Method, Path string
	// Now is the time of the claim; it becomes CreatedAt (of a new entry)
	// and LockedAt, and is compared with existing entries' ExpiresAt.
	Now time.Time
	// ExpiresAt is the new entry's expiry while it is in progress.
	ExpiresAt time.Time
	// StaleBefore: an in-progress entry with the same fingerprint whose
	// LockedAt is before this is taken over (its holder is presumed dead).
	StaleBefore time.Time
}

// ClaimResult is a store's answer to a claim.
type ClaimResult struct {
	// Claimed is true when the caller now holds the key: it must run the
	// request, then Complete or Release the entry with Token.
	Claimed bool
	// TookOver is true when the claim took over a stale in-progress entry.
	TookOver bool
	// Token is the new fencing token when Claimed.
	Token int64
	// Entry is the entry after the call: the caller's own when Claimed,
	// otherwise the one that stood in the way.
	Entry Entry
}

// CompleteRequest stores the response of a claimed request.
type CompleteRequest struct {
	// Scope and Key identify the entry; Token must hold its lock.
	Scope, Key string
	Token      int64
	// Response is stored as given; the store keeps its own copy.
	Response *StoredResponse
	// ExpiresAt is the completed entry's expiry: the stored response is
	// kept until then.
	ExpiresAt time.Time
}

// Store keeps idempotency entries. The middleware needs exactly these
// operations; each must be atomic with respect to the others on the same
// (scope, key), across every process that shares the store.
//
// Implementations must be safe for concurrent use. The package provides
// NewMemoryStore and OpenSQLiteStore; package storetest holds the
// conformance suite any implementation must pass.
type Store interface {
	// Claim takes (scope, key) for one request, in one atomic step (no
	// window between looking and inserting). It claims when there is no
	// entry, when the entry expired (ExpiresAt <= Now: it is replaced), and
	// when the entry is InProgress with the same fingerprint and a LockedAt
	// before StaleBefore (a take-over: the token changes, so the previous
	// holder is fenced off). Otherwise it returns the existing entry
	// unchanged with Claimed false.
	Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error)
	// Complete stores the response and marks the entry Completed, if req.Token
	// still holds its lock; otherwise it changes nothing and returns
	// ErrLockLost.
	Complete(ctx context.Context, req CompleteRequest) error
	// Release deletes an InProgress entry whose lock token holds, so that
	// the next request with the key runs again. It returns ErrLockLost, and
	// changes nothing, when the token does not hold the lock.
	Release(ctx context.Context, scope, key string, token int64) error
	// Renew moves LockedAt of an InProgress entry to now if token holds the
	// lock (a heartbeat of a handler that is still running), or returns
	// ErrLockLost.
	Renew(ctx context.Context, scope, key string, token int64, now time.Time) error
	// Get returns the entry for (scope, key), or ErrNotFound when there is
	// none or it expired (ExpiresAt <= now) but has not been swept yet.
	Get(ctx context.Context, scope, key string, now time.Time) (Entry, error)
	// Sweep deletes the entries that expired by now (ExpiresAt <= now) and
	// returns how many it deleted.
	Sweep(ctx context.Context, now time.Time) (int, error)
}

// expired reports whether an entry no longer counts at now.
func (e *Entry) expired(now time.Time) bool { return !e.ExpiresAt.After(now) }

// takeable reports whether a claim may take over e.
func (e *Entry) takeable(req *ClaimRequest) bool {
	return e.State == InProgress && e.Fingerprint == req.Fingerprint && e.LockedAt.Before(req.StaleBefore)
}

// sameResponse reports whether two responses are the same: status,
// header (names, values and their order) and body.
func sameResponse(a, b *StoredResponse) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Status == b.Status && bytes.Equal(a.Body, b.Body) &&
		maps.EqualFunc(a.Header, b.Header, slices.Equal[[]string])
}
