package powercut

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem"
)

// With IDEM_REVIEW4_WALLIMIT set, the loop's client child is childClient
// with a WAL limit of that many bytes: the committer's TRUNCATE checkpoint
// then resets the WAL every 100 ms or so, between durable commits, and the
// descriptor syncWAL keeps must still be the live WAL's.
func init() {
	if os.Getenv("IDEM_REVIEW4_WALLIMIT") != "" {
		children["client"] = review4ChildClient
	}
}

// The promise: an intent is durable before its request is sent, also when
// the WAL was truncated (wal_checkpoint(TRUNCATE), as SQLiteWALLimit makes
// the committer run) between two durable commits of one process.
func TestReview4PowerCutClientTruncatedWAL(t *testing.T) {
	t.Setenv("IDEM_REVIEW4_WALLIMIT", "8192")
	marks := filepath.Join(t.TempDir(), "shrinks")
	t.Setenv("IDEM_REVIEW4_MARKS", marks)
	fig := runClientLoop(t, clientLoop{sync: "full"})
	t.Log("figures: " + fig.String())
	assert.Empty(t, fig.ordersWithoutIntent, "no order for a key the journal does not hold")
	assert.Empty(t, fig.intentsLost, "no intent lost")
	assert.Zero(t, fig.duplicates, "one order per operation")
	assert.Zero(t, fig.lost, "every operation has its order")
	assert.Zero(t, fig.wrong, "every order under its operation's key")
	assert.Zero(t, fig.ackedNotHeld, "every acknowledged success is in the journal")
	assert.Zero(t, fig.ackedWrong, "every acknowledged success is the order the server has")
	assert.Positive(t, fig.acks, "the lives acknowledged successes")
	assert.Positive(t, fig.cutFiles, "the cuts dropped unsynced writes")
	b, _ := os.ReadFile(marks)
	t.Logf("durable commits that found the WAL shorter than the last one did: %d", len(b))
	assert.Positive(t, len(b), "the WAL was truncated between durable commits of one process")
}

// review4MarkShrinks returns an OnCommit hook that appends a byte to
// $IDEM_REVIEW4_MARKS (outside the cut file system) each time a durable
// commit finds the WAL shorter than the previous one did: a TRUNCATE
// checkpoint (or a restart) came between them in this process.
func review4MarkShrinks(journal string) func(idem.CommitInfo) {
	var last int64
	return func(ci idem.CommitInfo) {
		if !ci.Durable {
			return
		}
		fi, err := os.Stat(journal + "-wal")
		if err != nil {
			return
		}
		if fi.Size() < last {
			if f, err := os.OpenFile(os.Getenv("IDEM_REVIEW4_MARKS"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
				_, _ = f.Write([]byte{1})
				_ = f.Close()
			}
		}
		last = fi.Size()
	}
}

func review4ChildClient() error {
	o := &out{}
	var opts []idem.SQLiteOption
	if os.Getenv("PC_SYNC") == "normal" {
		opts = append(opts, idem.SQLiteSynchronousNormal())
	}
	if n, err := strconv.ParseInt(os.Getenv("IDEM_REVIEW4_WALLIMIT"), 10, 64); err == nil {
		opts = append(opts, idem.SQLiteWALLimit(n), idem.SQLiteOnCommit(review4MarkShrinks(os.Getenv("PC_JOURNAL"))))
	}
	j, err := idem.OpenSQLite(os.Getenv("PC_JOURNAL"), opts...)
	if err != nil {
		return err
	}
	defer j.Close()
	base := os.Getenv("PC_URL")
	c, err := idem.New(idem.Config{
		Journal: j, BaseURL: base,
		Status: printingStatus{next: idem.StatusEndpoint(base + "/idempotency"), out: o},
		Retry: idem.RetryPolicy{MinBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
			MaxRetryAfter: 50 * time.Millisecond, MaxAttempts: 5, MaxStatusChecks: 20, Budget: 10 * time.Second,
			RetryRatio: 1, MinRetriesPerSecond: 1000},
		AttemptTimeout: time.Second,
		LeaseDuration:  500 * time.Millisecond,
		Owner:          "powercut/" + strconv.Itoa(os.Getpid()),
	})
	if err != nil {
		return err
	}
	defer c.Close()
	o.printf("ready")
	ctx := context.Background()
	rep, err := c.Resume(ctx)
	if err != nil {
		o.printf("fail resume %v", err)
		return err
	}
	o.printf("resumed %d %d %d", rep.Claimed, rep.Succeeded, rep.Remaining())

	if os.Getenv("PC_FINAL") == "1" {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		for ctx.Err() == nil {
			var left []string
			for rec, err := range j.List(ctx, idem.Filter{}) {
				if err != nil {
					return err
				}
				if !rec.State.Terminal() {
					left = append(left, rec.ID)
				}
			}
			if len(left) == 0 {
				o.printf("settled")
				return nil
			}
			for _, id := range left {
				if err := drive(ctx, c, o, id); err != nil {
					return err
				}
			}
		}
		return ctx.Err()
	}

	next, err := strconv.Atoi(os.Getenv("PC_NEXT"))
	if err != nil {
		return err
	}
	var counter atomic.Int64
	counter.Store(int64(next))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				n := int(counter.Add(1) - 1)
				o.printf("take %d", n)
				if err := drive(ctx, c, o, opID(n)); err != nil {
					o.printf("fail %s %v", opID(n), err)
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.New("a worker failed")
}
