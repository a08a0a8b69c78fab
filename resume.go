package idem

import (
	"context"
	"errors"
	"sync"
)

// ResumeReport counts what Resume did, by where each operation it took up
// ended.
type ResumeReport struct {
	// Claimed is the number of operations Resume took up.
	Claimed int
	// Succeeded and Rejected settled with a definitive answer.
	Succeeded, Rejected int
	// Pending were still not sent (the server stayed unreachable), Unknown
	// still have no definitive answer; both are due again later.
	Pending, Unknown int
	// Expired passed the server's retention and need an operator's
	// Reconcile.
	Expired int
	// Skipped were being driven by another call in this process.
	Skipped int
	// Failed could not be driven: a journal error or a lost lease.
	Failed int
}

// Remaining is the number of operations taken up that are not settled.
func (r ResumeReport) Remaining() int { return r.Pending + r.Unknown + r.Expired + r.Failed }

func (r *ResumeReport) add(res *Result, err error) {
	var oe *OperationError
	switch {
	case err == nil && res.State == StateSucceeded:
		r.Succeeded++
	case err == nil:
		r.Rejected++
	case errors.As(err, &oe) && oe.conflict:
		r.Rejected++
	case errors.As(err, &oe) && oe.State == StatePending:
		r.Pending++
	case errors.As(err, &oe) && oe.State == StateExpired:
		r.Expired++
	case errors.As(err, &oe) && oe.State.Active() && !errors.Is(err, ErrLeaseLost):
		r.Unknown++
	default:
		r.Failed++
	}
}

// Resume finishes what was left unfinished, typically after a restart: it
// claims the journal's due operations (pending, in_flight and unknown) with
// a lease — when Config.BaseURL is set, only those whose URL has its origin,
// so that Authorize's credentials only ever go to the API they are for — at most Config.ResumeConcurrency at a time, and drives each as
// Do would, except that an operation found in_flight or unknown gets a
// status check before anything is re-sent. It returns when no due operation
// is left, or when ctx ends, with the counts by outcome; an operation that
// does not settle is due again after RetryPolicy.MaxBackoff. Operations
// leased by a live worker elsewhere are left to it.
//
// Progress goes to Config.OnResumeProgress after each operation and to the
// logger.
func (c *Client) Resume(ctx context.Context) (ResumeReport, error) {
	ctx, done, err := c.enter(ctx)
	if err != nil {
		return ResumeReport{}, err
	}
	defer done()
	var (
		rep   ResumeReport
		mu    sync.Mutex
		wg    sync.WaitGroup
		slots = make(chan struct{}, c.cfg.ResumeConcurrency)
	)
	finish := func(res *Result, err error) {
		mu.Lock()
		defer mu.Unlock()
		rep.add(res, err)
		if c.cfg.OnResumeProgress != nil {
			c.cfg.OnResumeProgress(rep)
		}
		if n := rep.Succeeded + rep.Rejected + rep.Remaining(); n%100 == 0 {
			c.log.Info("idem: resume progress", "done", n, "claimed", rep.Claimed, "succeeded", rep.Succeeded,
				"rejected", rep.Rejected, "pending", rep.Pending, "unknown", rep.Unknown, "expired", rep.Expired)
		}
	}
	var claimErr error
	// Only what was due when Resume started: an operation it leaves
	// unsettled is due again a little later and must not be claimed again
	// by this same call, which would then never end while a server fails.
	started := c.now()
	for ctx.Err() == nil {
		// Claim only as many operations as there are free workers, so that
		// no claimed operation waits in a queue while its lease runs.
		slots <- struct{}{}
		n := 1
		for n < cap(slots) {
			select {
			case slots <- struct{}{}:
				n++
				continue
			default:
			}
			break
		}
		recs, err := c.journal.Claim(ctx, ClaimRequest{Owner: c.cfg.Owner, Limit: n, Lease: c.cfg.LeaseDuration,
			DueBy: started, URLPrefix: c.resumePrefix()})
		for range n - len(recs) {
			<-slots
		}
		if err != nil {
			claimErr = err
			break
		}
		if len(recs) == 0 {
			break
		}
		mu.Lock()
		rep.Claimed += len(recs)
		mu.Unlock()
		for _, rec := range recs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				op := scopeID{rec.Scope, rec.ID}
				f, leader := c.startFlight(op)
				if !leader {
					// A Do in this process is on it: leave it that call.
					_ = c.journal.Release(outcomeCtx(ctx), rec.Key, rec.Lease)
					mu.Lock()
					rep.Skipped++
					mu.Unlock()
					return
				}
				defer c.endFlight(op, f)
				f.res, f.err = c.newDriver(rec).run(ctx)
				finish(f.res, f.err)
			}()
		}
	}
	wg.Wait()
	c.log.Info("idem: resume done", "claimed", rep.Claimed, "succeeded", rep.Succeeded, "rejected", rep.Rejected,
		"pending", rep.Pending, "unknown", rep.Unknown, "expired", rep.Expired, "skipped", rep.Skipped, "failed", rep.Failed)
	if claimErr != nil {
		return rep, claimErr
	}
	return rep, ctx.Err()
}

// resumePrefix is the origin of Config.BaseURL ("https://api.example.com/"),
// or "" (every operation) when it is not set.
func (c *Client) resumePrefix() string {
	if c.base == nil {
		return ""
	}
	return c.base.Scheme + "://" + c.base.Host + "/"
}
