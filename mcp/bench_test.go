package mcp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/benchcpu"
	idemmcp "github.com/idemkit/idem/mcp"
	"github.com/idemkit/idem/server"
)

// BenchmarkToolCall measures, in the same run, what a journaled tool call
// costs over a bare go-sdk CallTool to the same server: streamable HTTP on
// loopback, a send_email that does nothing, behind a Guard on a
// MemoryStore.
//
//   - bare: cs.CallTool without a key (the Guard lets it through);
//   - bare+key: cs.CallTool with a key in _meta (the Guard's own cost);
//   - caller/memory: Caller.Call on a MemoryJournal (the Caller's own cost);
//   - caller/sqlite: Caller.Call on the SQLite journal (one durable write
//     per call, as a runtime runs it).
//
// cpu-µs/op is the CPU of the whole process (client and server) per call.
// Give every mode the same b.N (a MemoryJournal and a MemoryStore keep what
// they hold, so a call costs more the more the run has made):
//
//	go test -run '^$' -bench 'ToolCall/callers=1/' -benchtime 2000x .
func BenchmarkToolCall(b *testing.B) {
	for _, callers := range []int{1, 16} {
		for _, via := range []string{"bare", "bare+key", "caller/memory", "caller/sqlite"} {
			b.Run(fmt.Sprintf("callers=%d/%s", callers, via), func(b *testing.B) {
				benchToolCall(b, callers, via)
			})
		}
	}
}

func benchToolCall(b *testing.B, callers int, via string) {
	guard, err := idemmcp.NewGuard(idemmcp.GuardConfig{Store: server.NewMemoryStore(), Tools: []string{"send_email"},
		Scope: func(context.Context, *mcp.CallToolRequest) string { return "agent" }})
	if err != nil {
		b.Fatal(err)
	}
	defer guard.Close()
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "send_email"}, func(context.Context, *mcp.CallToolRequest, emailIn) (*mcp.CallToolResult, emailOut, error) {
		return nil, emailOut{MessageID: "msg-1"}, nil
	})
	s.AddReceivingMiddleware(guard.Middleware)
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	defer srv.Close()
	// Enough idle connections for every caller, in every mode.
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer hc.CloseIdleConnections()
	open := func(ctx context.Context) (*mcp.ClientSession, error) {
		return mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).
			Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL, HTTPClient: hc, MaxRetries: -1}, nil)
	}
	args := emailIn{To: "ann@example.com", Subject: "invoice 7"}

	var call func(i int64) error
	var sqlite *idem.SQLiteJournal
	switch via {
	case "bare", "bare+key":
		cs, err := open(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		defer cs.Close()
		call = func(i int64) error {
			p := &mcp.CallToolParams{Name: "send_email", Arguments: args}
			if via == "bare+key" {
				p.Meta = mcp.Meta{idemmcp.MetaKey: fmt.Sprint("call_", i)}
			}
			res, err := cs.CallTool(context.Background(), p)
			if err == nil && res.IsError {
				err = fmt.Errorf("the tool failed: %v", res.Content)
			}
			return err
		}
	default:
		var j idem.Journal = idem.NewMemoryJournal()
		if via == "caller/sqlite" {
			sj, err := idem.OpenSQLite(filepath.Join(b.TempDir(), "calls.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer sj.Close()
			j, sqlite = sj, sj
		}
		c, err := idemmcp.NewCaller(idemmcp.CallerConfig{Journal: j, Server: "mail", Scope: "mcp", Open: open})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		call = func(i int64) error {
			res, err := c.Call(context.Background(), fmt.Sprint("call_", i), "send_email", args)
			if err == nil && res.IsError {
				err = fmt.Errorf("the tool failed: %v", res.Content)
			}
			return err
		}
	}
	// One call before the clock starts: the session is open in every mode.
	if err := call(0); err != nil {
		b.Fatal(err)
	}
	var s0 idem.SQLiteStats
	if sqlite != nil {
		s0 = sqlite.Stats()
	}
	runCallers(b, callers, call)
	if sqlite != nil {
		// The journal's own count: durable commits and flushes of
		// deferred ones are its fsyncs.
		s1 := sqlite.Stats()
		b.ReportMetric(float64(s1.DurableCommits+s1.Flushes-s0.DurableCommits-s0.Flushes)/float64(b.N), "fsyncs/op")
		b.ReportMetric(float64(s1.Writes-s0.Writes)/float64(b.N), "writes/op")
	}
}

// runCallers runs b.N calls (numbered from 1) from callers goroutines and
// reports ops/s and the process's CPU per call.
func runCallers(b *testing.B, callers int, call func(i int64) error) {
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := call(i); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	cpu0, cpuOK := benchcpu.Process()
	b.ResetTimer()
	t0 := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(t0)
	b.StopTimer()
	cpu1, _ := benchcpu.Process()
	if err, ok := failed.Load().(error); ok {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	if cpuOK {
		b.ReportMetric(float64(cpu1-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
	}
}
