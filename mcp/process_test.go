package mcp_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	idemmcp "github.com/idemkit/idem/mcp"
	"github.com/idemkit/idem/server"
)

func TestMain(m *testing.M) {
	if os.Getenv("IDEM_MCP_RUNTIME") != "" {
		runtimeChild()
		return
	}
	if os.Getenv(stdioServerEnv) != "" {
		stdioServerChild()
		return
	}
	os.Exit(m.Run())
}

// runtimeChild is an agent runtime in a process of its own: it calls
// send_email as tool call call_crash and waits for the answer, which the
// test never lets it see: it is SIGKILLed mid-call.
func runtimeChild() {
	j, err := idem.OpenSQLite(os.Getenv("IDEM_MCP_JOURNAL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	url := os.Getenv("IDEM_MCP_URL")
	c, err := idemmcp.NewCaller(idemmcp.CallerConfig{Journal: j, Server: "mail", Scope: "mcp",
		Open: func(ctx context.Context) (*mcp.ClientSession, error) {
			return mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).
				Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1}, nil)
		}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	_, err = c.Call(context.Background(), "call_crash", "send_email", emailIn{To: "ann@example.com", Subject: "invoice 7"})
	fmt.Fprintln(os.Stderr, "the call returned, which the test should not have let happen:", err)
	os.Exit(3)
}

// effects is the tool's own record of what it did: one row per e-mail,
// UNIQUE, so that a second run for the same e-mail is counted, not lost.
type effects struct {
	db *sql.DB
	mu sync.Mutex
	// dup counts the runs the UNIQUE constraint refused.
	dup int
}

func openEffects(t *testing.T, path string) *effects {
	t.Helper()
	db, err := sql.Open("sqlite3", path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	_, err = db.Exec(`CREATE TABLE IF NOT EXISTS sent (recipient TEXT, subject TEXT, UNIQUE (recipient, subject))`)
	require.NoError(t, err)
	return &effects{db: db}
}

func (e *effects) record(in emailIn) {
	if _, err := e.db.Exec(`INSERT INTO sent VALUES (?, ?)`, in.To, in.Subject); err != nil {
		e.mu.Lock()
		e.dup++
		e.mu.Unlock()
	}
}

func (e *effects) count(t *testing.T) int {
	var n int
	require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM sent`).Scan(&n))
	return n
}

// mailService is an MCP server on streamable HTTP whose send_email records
// its effect, behind a Guard on a durable (SQLite) store; hold, when set,
// is closed by the tool when it starts and waited on before it finishes.
func mailService(t *testing.T, storePath string, fx *effects, started chan<- struct{}, hold <-chan struct{}) (url string, store server.Store, stop func()) {
	t.Helper()
	sqliteStore, err := server.OpenSQLiteStore(storePath)
	require.NoError(t, err)
	store = sqliteStore
	g, err := idemmcp.NewGuard(idemmcp.GuardConfig{Store: store, Tools: []string{"send_email"},
		Scope: func(context.Context, *mcp.CallToolRequest) string { return "agent-1" }})
	require.NoError(t, err)
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "send_email"}, func(ctx context.Context, _ *mcp.CallToolRequest, in emailIn) (*mcp.CallToolResult, emailOut, error) {
		if started != nil {
			started <- struct{}{}
		}
		if hold != nil {
			<-hold
		}
		fx.record(in)
		return nil, emailOut{MessageID: "msg-" + in.Subject}, nil
	})
	s.AddReceivingMiddleware(g.Middleware)
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	var once sync.Once
	stop = func() {
		once.Do(func() {
			srv.Close() // waits for the requests it serves: the tool's result is stored
			_ = g.Close()
			_ = sqliteStore.Close()
		})
	}
	t.Cleanup(stop)
	return srv.URL, store, stop
}

// An agent runtime is SIGKILLed while its tool call runs; the server is
// restarted on its durable store; a new runtime's Resume finishes the call:
// the e-mail is sent once, and the runtime has its answer.
func TestRuntimeKilledMidCallResumesWithOneEffect(t *testing.T) {
	dir := t.TempDir()
	fx := openEffects(t, filepath.Join(dir, "effects.db"))
	started, hold := make(chan struct{}, 1), make(chan struct{})
	url, store, stop := mailService(t, filepath.Join(dir, "keys.db"), fx, started, hold)
	journal := filepath.Join(dir, "calls.db")

	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), "IDEM_MCP_RUNTIME=1", "IDEM_MCP_JOURNAL="+journal, "IDEM_MCP_URL="+url)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	select {
	case <-started:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the runtime's tool call never reached the tool")
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	close(hold) // the tool finishes after the runtime died: its answer has nobody to go to
	j := openSQLiteAt(t, journal)
	rec, err := j.Lookup(context.Background(), "mcp", "call_crash")
	require.NoError(t, err, "the call was journaled before it was sent")
	require.False(t, rec.State.Terminal(), "the killed runtime never saw the answer")
	// The tool runs on the session's goroutine, not the HTTP request's:
	// wait until its result is stored before the server stops.
	require.Eventually(t, func() bool {
		e, err := store.Get(context.Background(), "agent-1", rec.Key, time.Now())
		return err == nil && e.State == server.Completed
	}, 30*time.Second, 10*time.Millisecond, "the tool's result was stored under the call's key")
	stop()

	// The server comes back on the same store; a new runtime resumes.
	url, _, _ = mailService(t, filepath.Join(dir, "keys.db"), fx, nil, nil)
	c := openCaller(t, j, url)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		report, err := c.Resume(ctx)
		require.NoError(t, err)
		if report.Succeeded == 1 {
			break
		}
		if ctx.Err() != nil {
			rec, _ := j.Lookup(context.Background(), "mcp", "call_crash")
			t.Fatalf("the dead runtime's call was never taken up: %+v; record %s attempts %d lease %+v last error %q", report, rec.State, rec.Attempts, rec.Lease, rec.LastError)
		}
		time.Sleep(50 * time.Millisecond)
	}
	res, err := c.Result(context.Background(), "call_crash")
	require.NoError(t, err)
	assert.Equal(t, "msg-invoice 7", structured(t, res).MessageID)
	assert.Equal(t, 1, fx.count(t), "one e-mail")
	assert.Zero(t, fx.dup, "no second run of the tool")
}

// Two runtimes race on one tool-call ID: the tool runs once and both get
// its answer.
func TestTwoRuntimesRaceOnOneToolCallID(t *testing.T) {
	dir := t.TempDir()
	fx := openEffects(t, filepath.Join(dir, "effects.db"))
	url, _, _ := mailService(t, filepath.Join(dir, "keys.db"), fx, nil, nil)
	journal := filepath.Join(dir, "calls.db")
	var wg sync.WaitGroup
	answers := make([]string, 2)
	for i := range answers {
		c := openCaller(t, openSQLiteAt(t, journal), url)
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Call(context.Background(), "call_race", "send_email", emailIn{To: "bob@example.com", Subject: "race"})
			if assert.NoError(t, err) {
				answers[i] = structured(t, res).MessageID
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, []string{"msg-race", "msg-race"}, answers)
	assert.Equal(t, 1, fx.count(t))
	assert.Zero(t, fx.dup)
}

func openSQLiteAt(t *testing.T, path string) *idem.SQLiteJournal {
	t.Helper()
	j, err := idem.OpenSQLite(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	return j
}
