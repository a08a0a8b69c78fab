package journal

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// The functions in this file are the journal's rules, written once. Every
// Journal implementation reads the stored record inside its write
// transaction, calls the rule, and stores what it returns, so that all
// journals agree on what a legal write is.

// CheckDurability refuses, with ErrInvalidRecord, a Durability that is none
// of Durable, Deferred and Buffered. Journal.Update calls it first.
func CheckDurability(d Durability) error {
	if d > Buffered {
		return fmt.Errorf("%w: durability %d is not Durable, Deferred or Buffered", ErrInvalidRecord, uint8(d))
	}
	return nil
}

// CheckClaimRequest refuses, with ErrInvalidRecord, a request without an
// owner, a positive limit and a positive lease. Journal.Claim calls it
// first.
func CheckClaimRequest(req ClaimRequest) error {
	if req.Owner == "" || req.Limit <= 0 || req.Lease <= 0 {
		return fmt.Errorf("%w: a claim needs an owner, a positive limit and a positive lease (got %q, %d, %s)",
			ErrInvalidRecord, req.Owner, req.Limit, req.Lease)
	}
	return nil
}

// NewRecord checks a record given to Journal.Create and returns it as it must
// be stored: version 1, CreatedAt and UpdatedAt set to now, the lease epoch
// set to 1 when the record is created leased, times at millisecond
// precision. It also returns the creation event. maxBody is the journal's
// body limit; zero means DefaultMaxBodySize.
func NewRecord(rec Record, now time.Time, maxBody int) (Record, Event, error) {
	if maxBody <= 0 {
		maxBody = DefaultMaxBodySize
	}
	for _, f := range []struct{ name, v string }{
		{"Key", rec.Key}, {"Scope", rec.Scope}, {"ID", rec.ID},
		{"Method", rec.Method}, {"URL", rec.URL}, {"Fingerprint", rec.Fingerprint},
		{"KeyHeader", rec.KeyHeader},
	} {
		if f.v == "" {
			return Record{}, Event{}, fmt.Errorf("%w: %s is empty", ErrInvalidRecord, f.name)
		}
	}
	if rec.State != StatePending && rec.State != StateInFlight {
		return Record{}, Event{}, fmt.Errorf("%w: a new record must be pending or in_flight, not %s", ErrInvalidRecord, rec.State)
	}
	if len(rec.Body) > maxBody {
		return Record{}, Event{}, fmt.Errorf("%w: %d bytes, the limit is %d; send large payloads by reference", ErrBodyTooLarge, len(rec.Body), maxBody)
	}
	if rec.Attempts < 0 || rec.TransportResends < 0 {
		return Record{}, Event{}, fmt.Errorf("%w: negative attempt count", ErrInvalidRecord)
	}
	if rec.Response != nil {
		return Record{}, Event{}, fmt.Errorf("%w: a new record has no response", ErrInvalidRecord)
	}
	if len(rec.Link) > MaxLinkLength {
		return Record{}, Event{}, fmt.Errorf("%w: Link is %d bytes, the limit is %d", ErrInvalidRecord, len(rec.Link), MaxLinkLength)
	}
	now = TruncateTime(now)
	out := CloneRecord(rec)
	out.Version = 1
	out.CreatedAt, out.UpdatedAt = now, now
	out.NextAttemptAt = TruncateTime(out.NextAttemptAt)
	out.ExpiresAt = TruncateTime(out.ExpiresAt)
	if out.Lease.Owner != "" {
		if !TruncateTime(out.Lease.ExpiresAt).After(now) {
			return Record{}, Event{}, fmt.Errorf("%w: a leased record needs a lease expiry in the future", ErrInvalidRecord)
		}
		out.Lease = Lease{Owner: out.Lease.Owner, Epoch: 1, ExpiresAt: TruncateTime(out.Lease.ExpiresAt)}
	} else {
		out.Lease = Lease{}
	}
	return out, CreationEvent(out), nil
}

// CreationEvent is the first event of rec's history, the one NewRecord
// returns with it: everything in it is in the new record itself, so a
// journal may keep the record alone and derive the event from it for as
// long as the record is at its first version (the SQLite journal does).
func CreationEvent(rec Record) Event {
	ev := eventFor(Record{}, rec)
	ev.Kind = EventCreate
	return ev
}

// ApplyUpdate applies next to stored as Journal.Update does and returns the
// record to store with the event to append. It refuses the update, changing
// nothing, when:
//
//   - next.Lease names an owner and that owner no longer holds the stored
//     lease at the same epoch: ErrLeaseLost (a fenced write);
//   - next.Lease is empty (an operator's write) while another worker's
//     lease is live and gone does not report its owner gone: ErrLeased;
//   - stored.Version differs from next.Version: ErrConflict;
//   - the state machine forbids the move (see State.CanMoveTo):
//     ErrIllegalTransition;
//   - next.Attempts is lower than stored.Attempts: ErrInvalidRecord.
//
// Fencing is by owner and epoch, not by expiry: a holder whose lease has
// expired may still write until another worker takes the record over. A
// writer must therefore put in next.Lease the lease it was given by Claim or
// Acquire, never one read back from the journal.
//
// Only the mutable fields are taken from next: State, Attempts,
// TransportResends, NextAttemptAt, Response, LastError, Note, ExpiresAt
// and, for the lease holder, a later Lease.ExpiresAt (an earlier one is
// ignored, so a stale copy never undoes a Renew). The request and the key's
// wire form never change. A record that leaves the active states loses its
// lease. The event takes its Kind and Detail from why.
//
// The returned record shares the request's Header and Body with stored
// (they never change, and no journal writes to them in place) and owns a
// copy of next's Response: a journal that hands it to a caller hands a
// copy (CloneRecord).
func ApplyUpdate(stored, next Record, now time.Time, why Event, gone func(owner string) bool) (Record, Event, error) {
	now = TruncateTime(now)
	if next.Lease.Owner != "" {
		if stored.Lease.Owner != next.Lease.Owner || stored.Lease.Epoch != next.Lease.Epoch {
			return Record{}, Event{}, fmt.Errorf("%w: operation %s is now leased by %q at epoch %d, the write came from %q at epoch %d",
				ErrLeaseLost, stored.Key, stored.Lease.Owner, stored.Lease.Epoch, next.Lease.Owner, next.Lease.Epoch)
		}
	} else if !leaseFree(stored.Lease, now, gone) {
		return Record{}, Event{}, fmt.Errorf("%w: operation %s is leased by %q until %s",
			ErrLeased, stored.Key, stored.Lease.Owner, stored.Lease.ExpiresAt.Format(time.RFC3339))
	}
	if stored.Version != next.Version {
		return Record{}, Event{}, fmt.Errorf("%w: operation %s is at version %d, the write expected %d",
			ErrConflict, stored.Key, stored.Version, next.Version)
	}
	if !stored.State.CanMoveTo(next.State) {
		return Record{}, Event{}, fmt.Errorf("%w: operation %s cannot move from %s to %s",
			ErrIllegalTransition, stored.Key, stored.State, next.State)
	}
	if next.Attempts < stored.Attempts || next.TransportResends < stored.TransportResends {
		return Record{}, Event{}, fmt.Errorf("%w: attempt counts of %s cannot go down from %d/%d to %d/%d",
			ErrInvalidRecord, stored.Key, stored.Attempts, stored.TransportResends, next.Attempts, next.TransportResends)
	}
	out := stored // the request is never written to: shared, not copied
	out.State = next.State
	out.Attempts = next.Attempts
	out.TransportResends = next.TransportResends
	out.NextAttemptAt = TruncateTime(next.NextAttemptAt)
	out.Response = cloneResponse(next.Response)
	out.LastError = next.LastError
	out.Note = next.Note
	out.ExpiresAt = TruncateTime(next.ExpiresAt)
	// The holder may extend its lease but never shorten it: a stale copy
	// of the lease must not undo a Renew.
	if exp := TruncateTime(next.Lease.ExpiresAt); next.Lease.Owner != "" && exp.After(out.Lease.ExpiresAt) {
		out.Lease.ExpiresAt = exp
	}
	if !out.State.Active() {
		out.Lease = Lease{Epoch: stored.Lease.Epoch}
	}
	out.Version = stored.Version + 1
	out.UpdatedAt = now
	ev := eventFor(stored, out)
	ev.Owner = next.Lease.Owner
	ev.Kind, ev.Detail = why.Kind, why.Detail
	return out, ev, nil
}

// Claimable reports whether Claim may take rec at now: it is active, due
// by dueBy (or by now, when dueBy is zero), and its lease is free, lapsed,
// or held by an owner that gone reports gone (a nil gone knows of none).
func Claimable(rec Record, now, dueBy time.Time, gone func(owner string) bool) bool {
	if dueBy.IsZero() || dueBy.After(now) {
		dueBy = now
	}
	return rec.State.Active() && !rec.NextAttemptAt.After(dueBy) && leaseFree(rec.Lease, now, gone)
}

// leaseFree reports whether a lease may be taken at now.
func leaseFree(l Lease, now time.Time, gone func(string) bool) bool {
	return !l.Held(now) || (gone != nil && gone(l.Owner))
}

// ApplyClaim leases stored to owner for lease, as Claim and Acquire do: the
// epoch and the version increment, and the returned EventClaim names the
// previous holder and why its lease could be taken (it lapsed, or gone
// reports its owner gone). It returns ErrNotActive or ErrLeased when the
// record cannot be leased; a live lease of an owner not known to be gone is
// never taken, not even by its own owner (holders are told apart by epoch,
// not by name). A missing owner or a non-positive lease is
// ErrInvalidRecord. It does not look at NextAttemptAt; Claim selects due
// records with Claimable first. As with ApplyUpdate, the returned record
// shares its request and its Response with stored.
func ApplyClaim(stored Record, owner string, lease time.Duration, now time.Time, gone func(string) bool) (Record, Event, error) {
	now = TruncateTime(now)
	if owner == "" || lease <= 0 {
		return Record{}, Event{}, fmt.Errorf("%w: a lease needs an owner and a positive duration", ErrInvalidRecord)
	}
	if !stored.State.Active() {
		return Record{}, Event{}, fmt.Errorf("%w: operation %s is %s", ErrNotActive, stored.Key, stored.State)
	}
	if !leaseFree(stored.Lease, now, gone) {
		return Record{}, Event{}, fmt.Errorf("%w: operation %s is leased by %q until %s",
			ErrLeased, stored.Key, stored.Lease.Owner, stored.Lease.ExpiresAt.Format(time.RFC3339))
	}
	out := stored // shared, as in ApplyUpdate
	out.Lease = Lease{Owner: owner, Epoch: stored.Lease.Epoch + 1, ExpiresAt: TruncateTime(now.Add(lease))}
	out.Version = stored.Version + 1
	out.UpdatedAt = now
	ev := eventFor(stored, out)
	ev.Kind = EventClaim
	switch prev := stored.Lease; {
	case prev.Owner == "":
	case prev.Held(now):
		ev.Detail = fmt.Sprintf(takenOver+"%s: its owner is gone", prev.Owner)
	default:
		ev.Detail = fmt.Sprintf(takenOver+"%s: its lease lapsed at %s", prev.Owner,
			prev.ExpiresAt.UTC().Format("2006-01-02T15:04:05.000Z"))
	}
	return out, ev, nil
}

const takenOver = "taken over from "

// TakenFrom returns the owner a claim event took its operation's lease
// from, when the claim was a take-over (ApplyClaim's event says so).
func TakenFrom(ev Event) (owner string, ok bool) {
	rest, ok := strings.CutPrefix(ev.Detail, takenOver)
	if ev.Kind != EventClaim || !ok {
		return "", false
	}
	i := strings.LastIndex(rest, ": its ")
	if i < 0 {
		return "", false
	}
	return rest[:i], true
}

// ApplyRenew extends stored's lease to now+lease if l (owner and epoch) is
// still its lease and the record is active, as Renew does; it reports
// whether it did. The version does not change.
func ApplyRenew(stored Record, l Lease, lease time.Duration, now time.Time) (Record, bool) {
	if l.Owner == "" || stored.Lease.Owner != l.Owner || stored.Lease.Epoch != l.Epoch || !stored.State.Active() {
		return stored, false
	}
	if exp := TruncateTime(now.Add(lease)); exp.After(stored.Lease.ExpiresAt) {
		stored.Lease.ExpiresAt = exp
	}
	return stored, true
}

// ApplyRelease clears the lease l from stored, or returns ErrLeaseLost when
// l is not the stored lease. The version does not change: a release decides
// nothing (the holder's last Update said why it stopped), so it adds no
// event, and every version of a record has its event.
func ApplyRelease(stored Record, l Lease, now time.Time) (Record, error) {
	if l.Owner == "" || stored.Lease.Owner != l.Owner || stored.Lease.Epoch != l.Epoch {
		return Record{}, fmt.Errorf("%w: operation %s is leased by %q at epoch %d, not %q at epoch %d",
			ErrLeaseLost, stored.Key, stored.Lease.Owner, stored.Lease.Epoch, l.Owner, l.Epoch)
	}
	out := CloneRecord(stored)
	out.Lease = Lease{Epoch: stored.Lease.Epoch}
	out.UpdatedAt = TruncateTime(now)
	return out, nil
}

// Prunable reports whether Prune deletes rec for the cut-off before.
func Prunable(rec Record, before time.Time) bool {
	return rec.State.Terminal() && rec.UpdatedAt.Before(before)
}

// SortCounts orders counts by scope, then state, as Journal.Count returns
// them.
func SortCounts(c []Count) {
	slices.SortFunc(c, func(a, b Count) int {
		return cmp.Or(cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.State, b.State))
	})
}

// CloneRecord returns a deep copy of rec: no slice or map is shared. Empty
// bodies and headers come back nil, as every journal returns them.
func CloneRecord(rec Record) Record {
	rec.Header = cloneHeader(rec.Header)
	rec.Body = cloneBytes(rec.Body)
	rec.Response = cloneResponse(rec.Response)
	return rec
}

func cloneResponse(r *Response) *Response {
	if r == nil {
		return nil
	}
	c := *r
	c.Header = cloneHeader(r.Header)
	c.Body = cloneBytes(r.Body)
	return &c
}

func cloneBytes(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return slices.Clone(b)
}

func cloneHeader(h http.Header) http.Header {
	if len(h) == 0 {
		return nil
	}
	// One backing array for every value, not one slice per name: two
	// allocations whatever the header's size.
	return h.Clone()
}

func eventFor(before, after Record) Event {
	ev := Event{
		Version: after.Version,
		At:      after.UpdatedAt,
		From:    before.State,
		To:      after.State,
		Attempt: after.Attempts,
		Error:   after.LastError,
		Owner:   after.Lease.Owner,
	}
	if after.Response != nil {
		ev.StatusCode = after.Response.StatusCode
	}
	if after.Note != "" && after.Note != before.Note {
		ev.Error = after.Note
	}
	return ev
}

// TruncateTime returns t at the journal's precision, as every journal
// stores times: whole milliseconds since the Unix epoch, in the local time
// zone. The zero time stays zero. The rules truncate the times they set;
// a journal that stores a time it computes itself (a renewed lease's
// expiry, say) truncates it with TruncateTime.
func TruncateTime(t time.Time) time.Time {
	// A time within a millisecond after the zero instant truncates to it:
	// it must come back as the zero Time, as a zero Time does, and not
	// as that instant in Local, which IsZero but is not == time.Time{}.
	if t := time.UnixMilli(t.UnixMilli()); !t.IsZero() {
		return t
	}
	return time.Time{}
}
