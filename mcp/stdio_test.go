package mcp_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemmcp "github.com/idemkit/idem/mcp"
	"github.com/idemkit/idem/server"
)

// Environment of the MCP server child that serves over stdio.
const (
	stdioServerEnv = "IDEM_MCP_STDIO_SERVER" // "guarded" or "bare"
	stdioDirEnv    = "IDEM_MCP_STDIO_DIR"    // its key store and the tool's effects
	stdioHoldEnv   = "IDEM_MCP_STDIO_HOLD"   // "1": never answer a tools/call
)

// stdioServerChild is an MCP server in a process of its own, on stdio, as
// an MCP host starts one: send_email behind a Guard on a SQLite store in
// the directory (unless "bare"), recording each run and each e-mail in
// the tool's own tables. With hold, a tools/call is run (its result
// stored) but never answered, and the file "held" says so: the process is
// killed between the run and the answer.
func stdioServerChild() {
	dir := os.Getenv(stdioDirEnv)
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "stdio server:", err)
		os.Exit(2)
	}
	db, err := sql.Open("sqlite3", filepath.Join(dir, "effects.db"))
	if err != nil {
		fail(err)
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "send_email"}, func(ctx context.Context, _ *mcp.CallToolRequest, in emailIn) (*mcp.CallToolResult, emailOut, error) {
		if _, err := db.Exec(`INSERT INTO runs (recipient) VALUES (?)`, in.To); err != nil {
			return nil, emailOut{}, err
		}
		if _, err := db.Exec(`INSERT INTO sent VALUES (?, ?)`, in.To, in.Subject); err != nil {
			return nil, emailOut{}, fmt.Errorf("a second e-mail: %w", err)
		}
		return nil, emailOut{MessageID: "msg-" + in.Subject}, nil
	})
	if os.Getenv(stdioServerEnv) == "guarded" {
		store, err := server.OpenSQLiteStore(filepath.Join(dir, "keys.db"))
		if err != nil {
			fail(err)
		}
		g, err := idemmcp.NewGuard(idemmcp.GuardConfig{Store: store, Tools: []string{"send_email"},
			// A server on stdio has one client: the process that started it.
			Scope: func(context.Context, *mcp.CallToolRequest) string { return "stdio-client" }})
		if err != nil {
			fail(err)
		}
		s.AddReceivingMiddleware(g.Middleware)
	}
	if os.Getenv(stdioHoldEnv) == "1" {
		// Added last, so outermost: it sees the Guard's answer, after the
		// result is stored.
		s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
			return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
				res, err := next(ctx, method, req)
				if method == "tools/call" {
					_ = os.WriteFile(filepath.Join(dir, "held"), nil, 0o600)
					select {} // the answer never leaves: the process is killed here
				}
				return res, err
			}
		})
	}
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		fail(err)
	}
	os.Exit(0)
}

// startStdioServer starts the server child as an MCP host does, and
// connects to it over its stdin and stdout.
func startStdioServer(t *testing.T, dir, mode string, hold bool) (*exec.Cmd, *mcp.ClientSession) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), stdioServerEnv+"="+mode, stdioDirEnv+"="+dir)
	if hold {
		cmd.Env = append(cmd.Env, stdioHoldEnv+"=1")
	}
	cmd.Stderr = os.Stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "1"}, nil).
		Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cmd, cs
}

// The server side over stdio: a go-sdk server as a child process, killed
// (SIGKILL) after it ran a guarded call and before it answered, then
// restarted on its durable SQLite store: the same key again is replayed,
// not run again. The control, the same without the Guard, sends the
// e-mail twice (the tool's UNIQUE table refuses the second).
func TestGuardOverStdioReplaysAcrossAServerRestart(t *testing.T) {
	for _, mode := range []string{"guarded", "bare"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			fx, err := sql.Open("sqlite3", filepath.Join(dir, "effects.db"))
			require.NoError(t, err)
			t.Cleanup(func() { _ = fx.Close() })
			_, err = fx.Exec(`CREATE TABLE runs (recipient TEXT);
				CREATE TABLE sent (recipient TEXT, subject TEXT, UNIQUE (recipient, subject))`)
			require.NoError(t, err)
			params := &mcp.CallToolParams{Name: "send_email", Arguments: emailIn{To: "ann@example.com", Subject: "invoice 9"},
				Meta: mcp.Meta{idemmcp.MetaKey: "call_stdio_1"}}

			first, cs := startStdioServer(t, dir, mode, true)
			answered := make(chan error, 1)
			go func() {
				_, err := cs.CallTool(context.Background(), params)
				answered <- err
			}()
			require.Eventually(t, func() bool {
				_, err := os.Stat(filepath.Join(dir, "held"))
				return err == nil
			}, time.Minute, 10*time.Millisecond, "the server never ran the call")
			require.NoError(t, first.Process.Kill())
			select {
			case err := <-answered:
				require.Error(t, err, "the killed server never answered")
			case <-time.After(time.Minute):
				t.Fatal("the call did not end when its server was killed")
			}

			_, cs = startStdioServer(t, dir, mode, false)
			res, err := cs.CallTool(context.Background(), params)
			require.NoError(t, err)
			var runs, sent int
			require.NoError(t, fx.QueryRow(`SELECT count(*) FROM runs`).Scan(&runs))
			require.NoError(t, fx.QueryRow(`SELECT count(*) FROM sent`).Scan(&sent))
			assert.Equal(t, 1, sent, "the tool's own table holds one e-mail")
			if mode == "bare" {
				assert.Equal(t, 2, runs, "without the Guard the restarted server ran the call again")
				assert.True(t, res.IsError, "and its UNIQUE table refused the second e-mail")
				return
			}
			assert.Equal(t, 1, runs, "the restarted server did not run the call again")
			assert.False(t, res.IsError)
			assert.Equal(t, true, res.Meta[idemmcp.MetaReplayed])
			assert.Equal(t, "msg-invoice 9", structured(t, res).MessageID, "the first run's result, from the store")
		})
	}
}
