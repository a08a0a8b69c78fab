package powercut

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
)

// out writes whole lines to the unbuffered stdout, one write each, so that
// the parent reads every line a life completed before it was killed; or,
// with sink set, hands them to it.
type out struct {
	mu   sync.Mutex
	sink func(line string)
}

func (o *out) printf(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.sink != nil {
		o.sink(fmt.Sprintf(format, args...))
		return
	}
	_, _ = os.Stdout.WriteString(fmt.Sprintf(format, args...) + "\n")
}

func opID(n int) string { return "pc/op-" + strconv.Itoa(n) }

// orderOp is operation id: one order whose item is the operation's ID, so
// that an order names the operation it was made for.
func orderOp(id string) idem.Op {
	body, _ := json.Marshal(map[string]any{"item": id, "quantity": 1})
	return idem.Op{ID: id, URL: "/orders", Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
}

// printingStatus prints every status check and its answer.
type printingStatus struct {
	next idem.StatusChecker
	out  *out
}

func (s printingStatus) CheckStatus(ctx context.Context, q idem.StatusQuery) (idem.Status, error) {
	st, err := s.next.CheckStatus(ctx, q)
	if err != nil {
		s.out.printf("st %s error", q.Record.ID)
	} else {
		s.out.printf("st %s %s", q.Record.ID, st.State)
	}
	return st, err
}

// childClient is one life of the client. It opens the journal (PC_JOURNAL;
// synchronous=NORMAL when PC_SYNC is "normal"), prints "ready", runs
// Resume, then drives new operations pc/op-N from N = PC_NEXT on, eight at
// a time, printing "take N" before the first Do of N and "ok ID ORDER KEY"
// for every success, until it is killed. With PC_FINAL=1 it creates
// nothing: it drives what the journal holds unsettled until nothing is
// left, prints "settled" and closes. With PC_WALLIMIT set, the journal has
// a WAL limit of that many bytes, and each durable commit that finds the
// WAL shorter than the last one did is marked in PC_MARKS (markShrinks).
func childClient() error {
	o := &out{}
	var opts []idem.SQLiteOption
	if os.Getenv("PC_SYNC") == "normal" {
		opts = append(opts, idem.SQLiteSynchronousNormal())
	}
	if limit := os.Getenv("PC_WALLIMIT"); limit != "" {
		n, err := strconv.ParseInt(limit, 10, 64)
		if err != nil {
			return fmt.Errorf("PC_WALLIMIT: %w", err)
		}
		opts = append(opts, idem.SQLiteWALLimit(n),
			idem.SQLiteOnCommit(markShrinks(os.Getenv("PC_JOURNAL"), os.Getenv("PC_MARKS"))))
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

// markShrinks returns an OnCommit hook that appends a byte to marks
// (outside the cut file system) each time a durable commit finds the WAL
// shorter than the previous one did: a TRUNCATE checkpoint (or a restart)
// came between them in this process.
func markShrinks(journal, marks string) func(idem.CommitInfo) {
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
			if f, err := os.OpenFile(marks, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
				_, _ = f.Write([]byte{1})
				_ = f.Close()
			}
		}
		last = fi.Size()
	}
}

// drive runs Do for operation id until it is settled.
func drive(ctx context.Context, c *idem.Client, o *out, id string) error {
	for {
		res, err := c.Do(ctx, orderOp(id))
		switch {
		case err == nil:
			var order struct {
				ID string `json:"order_id"`
			}
			if err := json.Unmarshal(res.Body, &order); err != nil {
				return fmt.Errorf("success without an order: %q", res.Body)
			}
			o.printf("ok %s %s %s", id, order.ID, res.Key)
			return nil
		case errors.Is(err, idem.ErrRejected):
			o.printf("rejected %s %d", id, res.StatusCode)
			return nil
		case errors.Is(err, idem.ErrOutcomeUnknown), errors.Is(err, idem.ErrNotSent),
			errors.Is(err, idem.ErrRetryBudgetExhausted):
			if ctx.Err() != nil {
				return ctx.Err()
			}
		default:
			return err
		}
	}
}
