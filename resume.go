package idem

import (
	"context"
	"errors"
	"hash/maphash"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/journal"
)

// ResumeReport counts what Resume did: the operations it took up, by where
// each ended, and those in its scope it left alone, by why.
type ResumeReport struct {
	// Claimed is the number of operations Resume took up.
	Claimed int
	// Succeeded and Rejected settled with a definitive answer.
	Succeeded, Rejected int
	// Pending were still not sent (the server stayed unreachable), Unknown
	// still have no definitive answer; both are due again later.
	Pending, Unknown int
	// Expired passed the server's retention (Resume marks them without a
	// network call) or met a server that does not honour keys: they need
	// an operator's Reconcile.
	Expired int
	// Failed could not be driven: a journal error or a lost lease.
	Failed int

	// Busy were being driven by another call of this client.
	Busy int
	// Leased are leased by a live owner elsewhere (another process, or a
	// machine that shares the journal), which drives them.
	Leased int
	// NotDue are not due yet, the earliest at NextDue: an operation left
	// unsettled is due again after a backoff, or when the server said
	// (Retry-After). ResumeWait waits for them.
	NotDue  int
	NextDue time.Time
}

// Remaining is the number of operations taken up that are not settled.
func (r ResumeReport) Remaining() int { return r.Pending + r.Unknown + r.Expired + r.Failed }

// Skipped is the number of operations in Resume's scope it did not take up.
func (r ResumeReport) Skipped() int { return r.Busy + r.Leased + r.NotDue }

func (r ResumeReport) logAttrs() []any {
	return []any{"claimed", r.Claimed, "succeeded", r.Succeeded, "rejected", r.Rejected, "pending", r.Pending,
		"unknown", r.Unknown, "expired", r.Expired, "failed", r.Failed, "busy", r.Busy, "leased", r.Leased,
		"not_due", r.NotDue}
}

// outcome is where Resume left one operation.
type outcome uint8

const (
	outSucceeded outcome = iota + 1
	outRejected
	outPending
	outUnknown
	outExpired
	outFailed
)

func outcomeOf(res *Result, err error) outcome {
	var oe *OperationError
	switch {
	case err == nil && res != nil && res.State == StateSucceeded:
		return outSucceeded
	case errors.As(err, &oe) && errors.Is(err, ErrLeaseLost):
		return outFailed
	case errors.As(err, &oe) && oe.State == StateRejected:
		return outRejected
	case errors.As(err, &oe) && oe.State == StatePending:
		return outPending
	case errors.As(err, &oe) && oe.State == StateExpired:
		return outExpired
	case errors.As(err, &oe) && oe.State.Active():
		return outUnknown
	}
	return outFailed
}

// A ResumeOption changes what Resume takes up, or how long it goes on.
type ResumeOption func(*resumeOptions)

type resumeOptions struct {
	scopes    []string // "" alone: every scope
	anyOrigin bool
	wait      bool
	// background: the pass of Config.ResumeInterval, which the next one
	// follows: it takes what becomes due while it runs.
	background bool
}

// inBackground marks the passes of Config.ResumeInterval.
func inBackground() ResumeOption {
	return func(o *resumeOptions) { o.background = true }
}

// ResumeAllScopes makes Resume take up the operations of every scope, not
// only Config.ResumeScopes: for an operator's tool whose credentials are
// good for every tenant, or whose Authorize chooses them per operation.
func ResumeAllScopes() ResumeOption {
	return func(o *resumeOptions) { o.scopes = []string{""} }
}

// ResumeAnyOrigin makes Resume take up operations whatever their URL's
// origin, not only Config.BaseURL's: for an operator's tool, or a client
// whose Authorize chooses credentials per operation. It also takes up an
// operation that a build before the origin's canonical spelling journaled
// with an absolute Op.URL spelling BaseURL's origin another way
// ("https://API.example.com:443/orders"), which Resume without it does not
// find (the next Do of that operation continues it too).
func ResumeAnyOrigin() ResumeOption {
	return func(o *resumeOptions) { o.anyOrigin = true }
}

// ResumeWait makes Resume finish everything it can: instead of one pass
// over what is due, it waits for operations that are not due yet and for
// leases held elsewhere to end, and goes on until none of its operations is
// left unsettled or ctx ends. Use it at start-up, with a deadline.
func ResumeWait() ResumeOption {
	return func(o *resumeOptions) { o.wait = true }
}

// Resume finishes what was left unfinished, typically after a restart. It
// takes up the active operations (pending, in_flight, unknown) of
// Config.ResumeScopes (by default Config.Scope alone) whose URL has
// Config.BaseURL's origin (any origin when BaseURL is not set), so that
// Authorize's credentials only go to the tenant and the API they are for;
// ResumeAllScopes and ResumeAnyOrigin widen that for an operator.
//
// First it marks expired, without any network call, every operation whose
// outcome is unknown and whose server retention has passed, whatever its
// due time. Then it claims the operations due when it started, with a
// lease, at most Config.ResumeConcurrency at a time, and drives each as Do
// would, except that an operation found in_flight or unknown gets a status
// check before anything is re-sent. An operation leased by a process that
// is gone is taken at once, when the journal can see that (the SQLite
// journal always can); one leased by a live owner is left to it, except
// one under this client's own lease that a call of this client left behind
// (a journal write whose answer was lost), which no call holds: that one
// is taken up at once, as the next Do would. While
// slow operations keep some of its slots busy, it claims again every
// Config.ResumeInterval (every second without one) with the free ones, so
// that an operation whose owner dies meanwhile waits for no slow one. Without
// ResumeWait, Resume makes one pass: an operation it leaves unsettled is
// due again later, and not taken up again by the same call.
//
// It returns the counts by outcome, and of what it left alone and why; its
// error is ctx's, or a journal error. Progress goes to
// Config.OnResumeProgress after each operation and to the logger.
func (c *Client) Resume(ctx context.Context, opts ...ResumeOption) (ResumeReport, error) {
	ctx, exit, err := c.enter(ctx)
	if err != nil {
		return ResumeReport{}, err
	}
	defer exit.done()
	o := resumeOptions{scopes: c.cfg.ResumeScopes}
	for _, opt := range opts {
		opt(&o)
	}
	r := &resumer{c: c, opts: o, prefixes: c.resumePrefixes(o), unsettled: map[uint64]outcome{}}
	err = r.run(ctx)
	rep := r.report()
	// One line per pass, at Info only when it did something: a background
	// resume runs every ResumeInterval, mostly finding nothing.
	level := slog.LevelInfo
	if rep.Claimed == 0 && rep.Expired == 0 {
		level = slog.LevelDebug
	}
	c.log.Log(ctx, level, "idem: resume done", rep.logAttrs()...)
	return rep, err
}

// resumePrefixes are how the URLs of Config.BaseURL's origin begin in the
// journal ("https://api.example.com/"), or "" alone (every operation) when
// it is not set or the options say any: the origin's canonical spelling,
// which Do journals whatever spelling a worker's BaseURL has, and, when
// this client's BaseURL spells it otherwise, that spelling, which builds
// before journaled. An operation an earlier build journaled with an
// absolute Op.URL spelling the origin yet another way ("API.example.com:443")
// begins with neither: ResumeAnyOrigin takes it up, or the next Do of it.
func (c *Client) resumePrefixes(o resumeOptions) []string {
	if c.base == nil || o.anyOrigin {
		return []string{""}
	}
	canonical, configured := originPrefix(c.base), originPrefix(c.configured)
	if configured == canonical {
		return []string{canonical}
	}
	return []string{canonical, configured}
}

// resumer is one call of Resume.
type resumer struct {
	c        *Client
	opts     resumeOptions
	prefixes []string

	mu sync.Mutex
	// unsettled is where each operation taken up and left unsettled
	// (pending, unknown, failed) ended, by a hash of its key: a later pass
	// of ResumeWait may take it up again, and its new outcome replaces the
	// old in counts. A settled operation is never taken up again, so it is
	// only counted: memory grows with what Resume could not settle, not
	// with what it did. counts tallies the outcomes, claimed the distinct
	// operations, for a report that costs the same after the last
	// operation as after the first.
	unsettled map[uint64]outcome
	counts    [outFailed + 1]int
	claimed   int
	busy      int
	survey    survey
}

// settled reports whether an operation that ended so can be taken up
// again by the same Resume.
func (o outcome) settled() bool { return o == outSucceeded || o == outRejected || o == outExpired }

// run makes passes until nothing is left to do, or, with ResumeWait, until
// nothing is left at all or ctx ends.
func (r *resumer) run(ctx context.Context) error {
	for {
		started := r.c.now()
		if err := r.expireOverdue(ctx); err != nil {
			return err
		}
		if err := r.claimAndDrive(ctx, started); err != nil {
			return err
		}
		s, err := r.look(ctx)
		if err != nil {
			return err
		}
		if len(s.own) > 0 {
			// Operations leased to this client that no call of it holds
			// (a claim whose answer was lost, a driver stopped by a
			// journal error): taken up as those a call left behind are,
			// by the claims of another pass.
			for _, rec := range s.own {
				r.c.leave(rec.Key)
			}
			if err := r.claimAndDrive(ctx, r.c.now()); err != nil {
				return err
			}
			if s, err = r.look(ctx); err != nil {
				return err
			}
		}
		r.mu.Lock()
		r.survey = s
		r.mu.Unlock()
		if !r.opts.wait || s.unsettled == 0 {
			return ctx.Err()
		}
		// Wait for the next operation to become due or its lease to end,
		// but look again at least every second: a lease may end early
		// (its holder settles or dies) and nothing tells this process.
		wait := time.Second
		if next := s.nextChange(); !next.IsZero() {
			wait = min(wait, max(next.Sub(r.c.now()), 10*time.Millisecond))
		}
		if err := sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// finish records where one operation ended.
func (r *resumer) finish(key string, res *Result, err error) {
	r.mu.Lock()
	h, o := keyHash(key), outcomeOf(res, err)
	if old, ok := r.unsettled[h]; ok {
		r.counts[old]--
		delete(r.unsettled, h)
	} else {
		r.claimed++
	}
	if !o.settled() {
		r.unsettled[h] = o
	}
	r.counts[o]++
	rep := r.reportLocked()
	r.mu.Unlock()
	if r.c.cfg.OnResumeProgress != nil {
		r.c.cfg.OnResumeProgress(rep)
	}
	if n := rep.Succeeded + rep.Rejected + rep.Remaining(); n%100 == 0 {
		r.c.log.Info("idem: resume progress", rep.logAttrs()...)
	}
}

func (r *resumer) report() ResumeReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reportLocked()
}

func (r *resumer) reportLocked() ResumeReport {
	rep := ResumeReport{Claimed: r.claimed, Busy: r.busy,
		Succeeded: r.counts[outSucceeded], Rejected: r.counts[outRejected], Pending: r.counts[outPending],
		Unknown: r.counts[outUnknown], Expired: r.counts[outExpired], Failed: r.counts[outFailed]}
	rep.Leased, rep.NotDue, rep.NextDue = r.survey.leased, r.survey.notDue, r.survey.nextDue
	return rep
}

// inScope reports whether Resume may take rec up.
func (r *resumer) inScope(rec Record) bool {
	if !slices.ContainsFunc(r.prefixes, func(p string) bool { return strings.HasPrefix(rec.URL, p) }) {
		return false
	}
	for _, s := range r.opts.scopes {
		if s == "" || s == rec.Scope {
			return true
		}
	}
	return false
}

// active lists the operations in Resume's scope that are in one of states.
func (r *resumer) active(ctx context.Context, states []State, fn func(Record) error) error {
	for _, scope := range r.opts.scopes {
		f := Filter{Scope: scope, States: states}
		for rec, err := range r.c.journal.List(ctx, f) {
			if err != nil {
				return err
			}
			if !r.inScope(rec) {
				continue
			}
			if err := fn(rec); err != nil {
				return err
			}
		}
	}
	return nil
}

// expireOverdue marks expired every operation in scope whose outcome is
// unknown and whose server retention has passed, whatever its due time:
// no network call can settle it any more, and an operator must know now.
// One leased by a live owner elsewhere is left to it.
func (r *resumer) expireOverdue(ctx context.Context) error {
	now := r.c.now()
	// Only what finding them again takes, not whole records with their
	// bodies: a journal may hold many.
	type found struct{ key, scope, id string }
	var overdue []found
	// A pending operation never reached the server: no retention runs for
	// it, and it is not read at all.
	err := r.active(ctx, []State{StateInFlight, StateUnknown}, func(rec Record) error {
		if !rec.ExpiresAt.IsZero() && now.After(rec.ExpiresAt) {
			overdue = append(overdue, found{rec.Key, rec.Scope, rec.ID})
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, rec := range overdue {
		op := scopeID{rec.scope, rec.id}
		f, leader := r.c.startFlight(op, "")
		if !leader {
			continue // a call of this client drives it, and will expire it
		}
		acquired, err := r.c.journal.Acquire(ctx, rec.key, r.c.owner, r.c.cfg.LeaseDuration)
		if err == nil {
			// Past retention: it expires without sending.
			f.res, f.err = r.c.observe(ctx, callOf(CallResume, acquired), r.c.newDriver(acquired).run)
			r.finish(rec.key, f.res, f.err)
		} else if !errors.Is(err, ErrLeased) && !errors.Is(err, ErrNotActive) {
			f.err = err
			r.c.endFlight(op, f)
			return err
		}
		r.c.endFlight(op, f)
	}
	return nil
}

// claimAndDrive claims the operations of Resume's scopes due by started
// and drives them, ResumeConcurrency at a time, until none is left to
// claim and every driver is done.
//
// As many operations again are claimed ahead of the drivers, so that a
// driver that finishes finds its next operation claimed instead of waiting
// for a claim, a durable write of its own. Those waiting are held as the
// driven ones are: the renewer keeps their leases, however long the
// operations before them take.
//
// When nothing is left to claim but drivers are still busy, it claims
// again every poll interval with the slots that are free, so that slow
// operations (a status check that hangs, a server that holds requests up
// to the retry budget) never keep free slots from work that became
// claimable meanwhile: an operation whose owner died, and, in the
// background and with ResumeWait, one that became due.
func (r *resumer) claimAndDrive(ctx context.Context, started time.Time) error {
	c := r.c
	drivers := c.cfg.ResumeConcurrency
	slots := make(chan struct{}, 2*drivers) // claimed and not yet settled
	ready := make(chan Record, 2*drivers)
	freed := make(chan struct{}, 1) // a driver finished one
	var wg sync.WaitGroup
	for range drivers {
		wg.Go(func() {
			for rec := range ready {
				r.drive(ctx, rec)
				<-slots
				select {
				case freed <- struct{}{}:
				default:
				}
			}
		})
	}
	defer func() {
		close(ready)
		wg.Wait()
	}()
	for ctx.Err() == nil {
		slots <- struct{}{}
		n := 1
	fill:
		for n < cap(slots) {
			select {
			case slots <- struct{}{}:
				n++
			default:
				break fill
			}
		}
		dueBy := started
		if r.opts.wait || r.opts.background {
			dueBy = c.now()
		}
		recs, err := r.claim(ctx, n, dueBy)
		for range n - len(recs) {
			<-slots
		}
		for _, rec := range recs {
			c.hold(rec.Key, rec.Lease)
			ready <- rec
		}
		if err != nil {
			return err
		}
		if len(recs) == 0 && !r.awaitClaimable(ctx, slots, freed) {
			return nil
		}
	}
	return nil
}

// claim claims up to n operations of Resume's scopes due by dueBy: first
// those under this client's own lease that a call of it left behind (see
// adoptLeft), then what the journal lets it claim.
func (r *resumer) claim(ctx context.Context, n int, dueBy time.Time) ([]Record, error) {
	c := r.c
	out, err := r.adoptLeft(ctx, n, dueBy)
	if err != nil {
		return out, err
	}
	for _, scope := range r.opts.scopes {
		for _, prefix := range r.prefixes {
			if len(out) == n {
				return out, nil
			}
			recs, err := c.journal.Claim(ctx, ClaimRequest{Owner: c.owner, Limit: n - len(out), Lease: c.cfg.LeaseDuration,
				DueBy: dueBy, Scope: scope, URLPrefix: prefix})
			out = append(out, recs...)
			if err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// adoptLeft takes up to n operations of Resume's scopes, due by dueBy,
// that are under a live lease of this client's own which no call of it
// holds: a call left them behind (its journal write's answer was lost,
// say). The journal will not let this client claim them, its owner being
// alive; waiting for the lease to lapse would wait for nobody. Their
// writes stay fenced by the lease's epoch. A key whose operation is
// settled, or leased to another owner, is forgotten.
func (r *resumer) adoptLeft(ctx context.Context, n int, dueBy time.Time) ([]Record, error) {
	c := r.c
	var out []Record
	for _, key := range c.leftBehind() {
		if len(out) == n {
			break
		}
		rec, err := c.journal.Get(ctx, key)
		if errors.Is(err, ErrNotFound) {
			c.forget(key)
			continue
		}
		if err != nil {
			return out, err
		}
		now := c.now()
		switch {
		case !rec.State.Active() || rec.Lease.Owner != c.owner:
			c.forget(key)
		case !rec.Lease.Held(now) || !r.inScope(rec) || rec.NextAttemptAt.After(dueBy):
			// A lapsed lease is claimed as any other.
		case c.adoptUndriven(rec):
			out = append(out, rec)
		}
	}
	return out, nil
}

// awaitClaimable waits, after a claim that found nothing, until it is time
// to claim again: one poll interval, while some driver is busy. It
// reports false, at once, when every driver is idle (the pass is over),
// or once ctx ends.
func (r *resumer) awaitClaimable(ctx context.Context, slots chan struct{}, freed <-chan struct{}) bool {
	if len(slots) == 0 {
		return false
	}
	poll := r.c.cfg.ResumeInterval
	if poll <= 0 {
		poll = time.Second
	}
	t := time.NewTimer(poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-freed:
			if len(slots) == 0 {
				return false
			}
		}
	}
}

// drive drives one claimed operation, unless a call of this client is on
// it already.
func (r *resumer) drive(ctx context.Context, rec Record) {
	c := r.c
	op := scopeID{rec.Scope, rec.ID}
	f, leader := c.startFlight(op, "")
	if !leader {
		// A call of this client is on it: leave it that call.
		c.unhold(rec.Key)
		_ = c.journal.Release(outcomeCtx(ctx), rec.Key, rec.Lease)
		r.mu.Lock()
		r.busy++
		r.mu.Unlock()
		return
	}
	defer c.endFlight(op, f)
	defer c.unhold(rec.Key) // the driver holds it too, while it runs
	f.res, f.err = c.observe(ctx, c.resumeCall(ctx, rec), c.newDriver(rec).run)
	r.finish(rec.Key, f.res, f.err)
}

// survey is what a pass left alone in Resume's scope, and why.
type survey struct {
	leased, notDue int
	nextDue        time.Time // earliest due time of an operation not due yet
	leaseEnds      time.Time // earliest end of a lease held elsewhere
	// unsettled counts every active operation in scope: left alone, left
	// unsettled by this call, or due now.
	unsettled int
	// own are leased to this client and held by no call of it: run
	// takes them up.
	own []Record
}

// look counts the active operations in scope that this call did not
// settle: leased by a live owner elsewhere, or not due yet.
func (r *resumer) look(ctx context.Context) (survey, error) {
	now := r.c.now()
	var s survey
	err := r.active(ctx, []State{StatePending, StateInFlight, StateUnknown}, func(rec Record) error {
		r.mu.Lock()
		_, taken := r.unsettled[keyHash(rec.Key)]
		r.mu.Unlock()
		switch {
		case rec.Lease.Held(now) && rec.Lease.Owner == r.c.owner && !r.c.holds(rec.Key) && !r.c.driving(rec) &&
			!rec.NextAttemptAt.After(now):
			// Due, as a claim would take it: a backoff or a server's
			// Retry-After is kept.
			s.own = append(s.own, rec)
		case rec.Lease.Held(now) && rec.Lease.Owner != r.c.owner:
			s.leased++
			if s.leaseEnds.IsZero() || rec.Lease.ExpiresAt.Before(s.leaseEnds) {
				s.leaseEnds = rec.Lease.ExpiresAt
			}
		case rec.NextAttemptAt.After(now):
			if !taken {
				s.notDue++
			}
			if s.nextDue.IsZero() || rec.NextAttemptAt.Before(s.nextDue) {
				s.nextDue = rec.NextAttemptAt
			}
		}
		s.unsettled++
		return nil
	})
	return s, err
}

func (s survey) nextChange() time.Time {
	switch {
	case s.nextDue.IsZero():
		return s.leaseEnds
	case s.leaseEnds.IsZero() || s.nextDue.Before(s.leaseEnds):
		return s.nextDue
	}
	return s.leaseEnds
}

// keySeed makes keyHash's hashes this process's own.
var keySeed = maphash.MakeSeed()

// keyHash identifies a key among those of one Resume.
func keyHash(key string) uint64 { return maphash.String(keySeed, key) }

// resumeCall describes the call that drives a claimed record, with the
// owner it was taken from when the claim was a take-over: read from the
// claim's event, only when the client has hooks and the record had an
// earlier lease.
func (c *Client) resumeCall(ctx context.Context, rec Record) Call {
	call := callOf(CallResume, rec)
	if !c.observed || rec.Lease.Epoch < 2 {
		return call
	}
	events, err := c.journal.History(ctx, rec.Key)
	if err != nil {
		return call
	}
	for i := len(events) - 1; i >= 0; i-- {
		if events[i].Kind == EventClaim {
			call.TakenFrom, _ = journal.TakenFrom(events[i])
			break
		}
	}
	return call
}
