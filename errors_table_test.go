package idem_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// errorRow is one row of the README's error tables.
type errorRow struct {
	names []string // the identifiers of its first column
	also  []string // those in its parenthesis: what its errors also match
	rest  []string // the other columns
}

// readErrorTables returns the rows of the two tables under "## Errors" in
// README.md: the errors, and their causes.
func readErrorTables(t *testing.T) (errs, causes []errorRow) {
	t.Helper()
	b, err := os.ReadFile("README.md")
	require.NoError(t, err)
	s := string(b)
	i := strings.Index(s, "\n## Errors\n")
	require.GreaterOrEqual(t, i, 0, "README.md has an Errors section")
	s = s[i+1:]
	if j := strings.Index(s[3:], "\n## "); j >= 0 {
		s = s[:j+3]
	}
	ident := regexp.MustCompile("`([A-Za-z.]+)`")
	table := 0
	inTable := false
	for line := range strings.SplitSeq(s, "\n") {
		if !strings.HasPrefix(line, "|") {
			inTable = false
			continue
		}
		if !inTable {
			inTable = true
			table++
			continue // the header
		}
		cols := strings.Split(strings.Trim(line, "|"), "|")
		if strings.HasPrefix(strings.TrimSpace(cols[0]), "---") {
			continue
		}
		var row errorRow
		// Only the identifiers before a parenthesis name the row; those in
		// it are the sentinels the row's errors also match.
		first, paren, _ := strings.Cut(cols[0], "(")
		for _, m := range ident.FindAllStringSubmatch(first, -1) {
			row.names = append(row.names, m[1])
		}
		for _, m := range ident.FindAllStringSubmatch(paren, -1) {
			row.also = append(row.also, m[1])
		}
		for _, c := range cols[1:] {
			row.rest = append(row.rest, strings.TrimSpace(c))
		}
		if table == 1 {
			errs = append(errs, row)
		} else {
			causes = append(causes, row)
		}
	}
	require.NotEmpty(t, errs, "the errors table")
	require.NotEmpty(t, causes, "the causes table")
	return errs, causes
}

// sentinels names every error the tables may mention.
var sentinels = map[string]error{
	"ErrInvalidOp": idem.ErrInvalidOp, "ErrBodyTooLarge": idem.ErrBodyTooLarge, "ErrInvalidConfig": idem.ErrInvalidConfig,
	"ErrClientClosed": idem.ErrClientClosed, "ErrFingerprintMismatch": idem.ErrFingerprintMismatch,
	"ErrKeyConflict": idem.ErrKeyConflict, "ErrRejected": idem.ErrRejected, "ErrKeyNotHonoured": idem.ErrKeyNotHonoured,
	"ErrNeedsReconciliation": idem.ErrNeedsReconciliation, "ErrCanceled": idem.ErrCanceled, "ErrNotSent": idem.ErrNotSent,
	"ErrOutcomeUnknown": idem.ErrOutcomeUnknown, "ErrBadStatus": idem.ErrBadStatus,
	"ErrRetryBudgetExhausted": idem.ErrRetryBudgetExhausted, "ErrLeaseLost": idem.ErrLeaseLost,
	"ErrAuthorizeFailed":       idem.ErrAuthorizeFailed,
	"context.DeadlineExceeded": context.DeadlineExceeded, "context.Canceled": context.Canceled,
}

// TestEveryErrorOfTheTable produces every error of the README's tables from
// a real server (or a real bad input) and checks what its row says: the
// sentinel matches, it is an *OperationError or not, it also matches what
// the row names in parentheses, and a cause comes under the sentinels its
// row names.
func TestEveryErrorOfTheTable(t *testing.T) {
	t.Parallel()
	errs, causes := readErrorTables(t)
	for _, row := range errs {
		for _, name := range row.names {
			if name == "nil" {
				continue
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				produce, ok := errorProducers[name]
				require.True(t, ok, "the README's table lists %s, and no producer makes it", name)
				_, err := produce(t)
				require.ErrorIs(t, err, sentinels[name])
				var oe *idem.OperationError
				isOE := errors.As(err, &oe)
				assert.Equal(t, strings.HasPrefix(row.rest[0], "yes"), isOE, "the table says %q about an *OperationError: %v", row.rest[0], err)
				for _, also := range row.also {
					require.ErrorIs(t, err, sentinels[also], "the row says it also matches %s", also)
				}
			})
		}
	}
	for _, row := range causes {
		for _, name := range row.names {
			t.Run("cause "+name, func(t *testing.T) {
				t.Parallel()
				produce, ok := causeProducers[name]
				require.True(t, ok, "the README's causes table lists %s, and no producer makes it", name)
				_, err := produce(t)
				require.ErrorIs(t, err, sentinels[name])
				var under []error
				for _, m := range regexp.MustCompile("`(Err[A-Za-z]+)`").FindAllStringSubmatch(row.rest[0], -1) {
					under = append(under, sentinels[m[1]])
				}
				require.NotEmpty(t, under)
				matched := false
				for _, u := range under {
					matched = matched || errors.Is(err, u)
				}
				assert.True(t, matched, "%s comes under one of %q: %v", name, row.rest[0], err)
				var oe *idem.OperationError
				assert.True(t, errors.As(err, &oe), "a cause comes in an *OperationError: %v", err)
			})
		}
	}
	t.Run("every producer is in the table", func(t *testing.T) {
		listed := map[string]bool{}
		for _, row := range append(errs, causes...) {
			for _, n := range row.names {
				listed[n] = true
			}
		}
		for name := range errorProducers {
			assert.True(t, listed[name], "%s can be returned and is missing from the README's table", name)
		}
		for name := range causeProducers {
			assert.True(t, listed[name], "%s can be a cause and is missing from the README's causes table", name)
		}
	})
}

type producer func(t *testing.T) (*idem.Result, error)

// downURL is an address nothing listens on.
func downURL(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	u := "http://" + l.Addr().String()
	require.NoError(t, l.Close())
	return u
}

// answering is a server that answers every request with code and body.
func answering(t *testing.T, code int, header http.Header, body string) string {
	srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		for k, v := range header {
			w.Header()[k] = v
		}
		w.WriteHeader(code)
		fmt.Fprint(w, body)
	})
	return srv.URL
}

var errorProducers = map[string]producer{
	"ErrInvalidOp": func(t *testing.T) (*idem.Result, error) {
		c, _ := newClient(t, idem.Config{BaseURL: answering(t, 201, nil, "")})
		return c.Do(context.Background(), idem.Op{URL: "/orders"}) // no ID
	},
	"ErrBodyTooLarge": func(t *testing.T) (*idem.Result, error) {
		c, _ := newClient(t, idem.Config{BaseURL: answering(t, 201, nil, "")})
		return c.Do(context.Background(), idem.Op{ID: "big", URL: "/orders", Body: bytes.Repeat([]byte("x"), idem.DefaultMaxBodySize+1)})
	},
	"ErrInvalidConfig": func(t *testing.T) (*idem.Result, error) {
		_, err := idem.New(idem.Config{Journal: idem.NewMemoryJournal(), BaseURL: "not a URL"})
		return nil, err
	},
	"ErrClientClosed": func(t *testing.T) (*idem.Result, error) {
		c, _ := newClient(t, idem.Config{BaseURL: answering(t, 201, nil, "")})
		require.NoError(t, c.Close())
		return c.Do(context.Background(), idem.Op{ID: "late", URL: "/orders"})
	},
	"ErrFingerprintMismatch": func(t *testing.T) (*idem.Result, error) {
		c, _ := newClient(t, idem.Config{BaseURL: answering(t, 201, nil, "")})
		first, err := c.Do(context.Background(), idem.Op{ID: "op", URL: "/orders", Body: []byte("a")})
		require.NoError(t, err)
		res, err := c.Do(context.Background(), idem.Op{ID: "op", URL: "/orders", Body: []byte("b")})
		var oe *idem.OperationError
		require.ErrorAs(t, err, &oe)
		assert.Equal(t, first.Key, oe.Key, "the error names the existing record")
		assert.Equal(t, idem.StateSucceeded, oe.State)
		return res, err
	},
	"ErrKeyConflict": func(t *testing.T) (*idem.Result, error) {
		base := answering(t, http.StatusUnprocessableEntity, http.Header{"Content-Type": {"application/problem+json"}},
			`{"type":"urn:idem:problem:key-reused","status":422}`)
		c, _ := newClient(t, idem.Config{BaseURL: base, Retry: fastRetry()})
		res, err := c.Do(context.Background(), idem.Op{ID: "op", URL: "/orders"})
		require.NotNil(t, res)
		return res, err
	},
	"ErrRejected": func(t *testing.T) (*idem.Result, error) {
		c, _ := newClient(t, idem.Config{BaseURL: answering(t, http.StatusForbidden, nil, "no"), Retry: fastRetry()})
		res, err := c.Do(context.Background(), idem.Op{ID: "op", URL: "/orders"})
		require.NotNil(t, res)
		var oe *idem.OperationError
		require.ErrorAs(t, err, &oe)
		assert.Equal(t, http.StatusForbidden, oe.StatusCode)
		assert.Equal(t, "no", string(oe.Body))
		return res, err
	},
	"ErrKeyNotHonoured": func(t *testing.T) (*idem.Result, error) {
		srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
			body := fmt.Sprintf(`{"order_id":"ord_%d","status":"created"}`, n)
			if n == 1 { // the first answer breaks off half-way
				w.Header().Set("Content-Length", fmt.Sprint(len(body)))
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte(body[:len(body)/2]))
				w.(http.Flusher).Flush()
				dropConn(w)
				return
			}
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, body) // a new order each time: keys are ignored
		})
		c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry()})
		return c.Do(context.Background(), idem.Op{ID: "op", URL: "/orders"})
	},
	"ErrNeedsReconciliation": func(t *testing.T) (*idem.Result, error) {
		srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet {
				http.Error(w, "down", http.StatusBadGateway)
				return
			}
			dropConn(w) // applied, answer lost
		})
		policy := fastRetry()
		policy.MaxStatusChecks = 1
		c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/status"),
			Retry: policy, Retention: time.Second}) // not less: a loaded machine's first call may outlive it
		_, err := c.Do(context.Background(), idem.Op{ID: "op", URL: "/orders"})
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
		time.Sleep(1100 * time.Millisecond) // past the server's retention
		return c.Do(context.Background(), idem.Op{ID: "op", URL: "/orders"})
	},
	"ErrCanceled": func(t *testing.T) (*idem.Result, error) {
		c, _ := newClient(t, idem.Config{BaseURL: answering(t, 201, nil, "")})
		op, err := c.Begin(context.Background(), idem.Op{ID: "op", URL: "/orders"})
		require.NoError(t, err)
		require.NoError(t, c.Cancel(context.Background(), op.Key()))
		return op.Send(context.Background())
	},
	"ErrNotSent": func(t *testing.T) (*idem.Result, error) {
		c, _ := newClient(t, idem.Config{BaseURL: downURL(t), Retry: fastRetry()})
		return c.Do(context.Background(), idem.Op{ID: "op", URL: "/orders"})
	},
	"ErrOutcomeUnknown": func(t *testing.T) (*idem.Result, error) {
		return causeProducers["ErrBadStatus"](t)
	},
}

var causeProducers = map[string]producer{
	"ErrBadStatus": func(t *testing.T) (*idem.Result, error) {
		srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet {
				fmt.Fprint(w, `{"status":"done"}`)
				return
			}
			dropConn(w)
		})
		policy := fastRetry()
		policy.MaxStatusChecks = 2
		c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Status: idem.StatusEndpoint(srv.URL + "/status"), Retry: policy})
		return c.Do(context.Background(), idem.Op{ID: "op", URL: "/orders"})
	},
	"ErrRetryBudgetExhausted": func(t *testing.T) (*idem.Result, error) {
		srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusTooManyRequests) // refused before processing, no Retry-After
		})
		policy := fastRetry()
		policy.MinRetriesPerSecond = 0.1 // a bucket of one token, refilled slowly
		policy.RetryRatio = 0.01
		c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: policy})
		var last error
		for i := range 5 {
			_, last = c.Do(context.Background(), idem.Op{ID: fmt.Sprint("op-", i), URL: "/orders"})
			if errors.Is(last, idem.ErrRetryBudgetExhausted) {
				break
			}
		}
		return nil, last
	},
	"ErrLeaseLost": func(t *testing.T) (*idem.Result, error) {
		path := filepath.Join(t.TempDir(), "ops.db")
		var posts atomic.Int32
		srv := newScripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
			if posts.Add(1) == 1 {
				takeOverAll(t, path) // another worker takes the operation over
			}
			w.WriteHeader(http.StatusConflict)
		})
		c, _ := newClient(t, idem.Config{Journal: openJournal(t, path), BaseURL: srv.URL, Retry: fastRetry(), Status: idem.ReplayStatus()})
		return c.Do(context.Background(), idem.Op{ID: "op", URL: "/orders"})
	},
	"ErrAuthorizeFailed": func(t *testing.T) (*idem.Result, error) {
		srv := newScripted(t, func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })
		c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry(),
			Authorize: func(*http.Request) error { return errors.New("no token") }})
		return c.Do(context.Background(), idem.Op{ID: "op", URL: "/orders"})
	},
	"context.DeadlineExceeded": func(t *testing.T) (*idem.Result, error) {
		srv := newScripted(t, func(int, http.ResponseWriter, *http.Request) { time.Sleep(time.Second) })
		c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry()})
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		return c.Do(ctx, idem.Op{ID: "op", URL: "/orders"})
	},
	"context.Canceled": func(t *testing.T) (*idem.Result, error) {
		ctx, cancel := context.WithCancel(context.Background())
		srv := newScripted(t, func(int, http.ResponseWriter, *http.Request) { cancel(); time.Sleep(time.Second) })
		c, _ := newClient(t, idem.Config{BaseURL: srv.URL, Retry: fastRetry()})
		return c.Do(ctx, idem.Op{ID: "op", URL: "/orders"})
	},
}

// takeOverAll plays another worker taking every operation of the journal
// at path over: it moves each lease to a new epoch under another owner, as
// Claim would, through a connection of its own.
func takeOverAll(t *testing.T, path string) {
	db, err := sql.Open("sqlite3", "file:"+path+"?_busy_timeout=5000")
	if err != nil {
		t.Error(err)
		return
	}
	defer db.Close()
	if _, err := db.Exec(`INSERT INTO dict (value) VALUES (X'7468696566') ON CONFLICT DO NOTHING;
		UPDATE operations SET lease_epoch = lease_epoch + 1, lease_owner = (SELECT id FROM dict WHERE value = X'7468696566')`); err != nil {
		t.Error(err)
	}
}
