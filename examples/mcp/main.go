// MCP shows an agent runtime calling tools with side effects (send an
// e-mail, open a ticket) on an MCP server, through idem: each tool call
// runs once, although its answer gets lost and the runtime is killed in
// the middle of one.
//
// The runtime calls each tool through an idemmcp.Caller, named by the
// tool-call ID the model gave it: the call is journaled with its tool, its
// arguments and an idempotency key before it is sent, and the key travels
// in the request's _meta. The MCP server (go-sdk, streamable HTTP) puts
// its tools behind an idemmcp.Guard, which runs a tool once per key and
// replays its result to a repeated key. The story:
//
//  1. The runtime, a process of its own, runs a scripted transcript (no
//     model needed). The server loses its answer to create_ticket after
//     the ticket was opened; the Caller sends the call again with its key,
//     and the server replays the ticket instead of opening a second one.
//
//  2. The runtime is killed (SIGKILL) while send_email runs.
//
//  3. After the restart, Resume finishes the journaled call with its key:
//     the server replays the e-mail's result; no second e-mail.
//
//  4. The restarted runtime replays the transcript from the start to
//     rebuild the conversation: every result comes from the journal.
//
//     cd examples/mcp && go run .
//
// main.go is the runtime, the part an agent runtime copies; crash.go runs
// it as the process that gets killed; tool_server.go is the demo MCP server,
// whose newMCPServer is the part an MCP server copies.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/child"
	"github.com/idemkit/idem/examples/internal/demo"
	idemmcp "github.com/idemkit/idem/mcp"
)

var journalFlag = flag.String("journal", "", "journal file to create and keep, for `idem ls` (default: a temporary file, removed at the end)")

// ToolCall is a tool call as the model emits it.
type ToolCall struct {
	// ID is assigned by the model and recorded in the transcript.
	ID   string
	Tool string
	Args json.RawMessage
}

// Step is one model turn: the tool calls it asked for.
type Step struct {
	Calls []ToolCall
}

// conversation names the transcript below. Tool-call IDs are unique only
// within a conversation, so it is the journal's scope of their calls.
const conversation = "conv_7d41"

var transcript = []Step{
	{Calls: []ToolCall{
		{ID: "call_8f2", Tool: "send_email", Args: json.RawMessage(`{"to":"customer-1042","template":"order-delayed"}`)},
	}},
	{Calls: []ToolCall{
		{ID: "call_9a1", Tool: "create_ticket", Args: json.RawMessage(`{"queue":"shipping","title":"Order ord_1042 is late"}`)},
	}},
	{Calls: []ToolCall{
		{ID: "call_b37", Tool: "send_email", Args: json.RawMessage(`{"to":"shipping-team","template":"ticket-opened"}`)},
	}},
}

func main() {
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var err error
	if isRuntime() {
		err = runtimeMain(ctx) // the process the demo kills: see crash.go
	} else {
		err = run(ctx, os.Stdout)
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcp:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	out = demo.NewSyncWriter(out)
	tmp, err := os.MkdirTemp("", "idem-mcp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	journalPath, err := demo.JournalPath(tmp, "calls.db", *journalFlag)
	if err != nil {
		return err
	}
	tools, err := startToolServer()
	if err != nil {
		return err
	}
	defer tools.Close()
	fmt.Fprintf(out, "MCP server on %s (send_email and create_ticket behind an idemmcp.Guard), journal %s, conversation %s\n",
		tools.URL, journalPath, conversation)

	// 1. The runtime runs the transcript, in a process of its own.
	fmt.Fprintln(out, "\n1. The agent runtime starts (a process of its own) and runs the transcript.")
	fmt.Fprintln(out, "   The server will lose its answer to create_ticket once, and hold send_email to shipping-team.")
	tools.loseNextAnswer("create_ticket")
	started, release := tools.holdNextRun("send_email", "shipping-team")
	defer release()
	app, err := child.Start(out, runtimeEnv+"=1", journalEnv+"="+journalPath, serverEnv+"="+tools.URL)
	if err != nil {
		return err
	}
	defer app.Kill()
	select {
	case <-started:
	case <-app.Exited():
		return fmt.Errorf("the runtime exited before the crash: %v", app.Err())
	case <-time.After(2 * time.Minute):
		return errors.New("the runtime's send_email for call_b37 never reached the tool")
	}

	// 2. The crash.
	fmt.Fprintln(out, "\n2. The runtime is killed (SIGKILL) while send_email runs for call_b37.")
	fmt.Fprintln(out, "   "+app.Kill())
	release() // the e-mail goes out; its answer has nobody to go to

	// 3. The restart.
	fmt.Fprintln(out, "\n3. The runtime restarts on its journal.")
	rt, err := openRuntime(journalPath, tools.URL, out)
	if err != nil {
		return err
	}
	defer rt.Close()
	rec, err := rt.caller.Client().Lookup(ctx, "", "call_b37")
	if err != nil {
		return err
	}
	credential := "no credential"
	if rec.Header.Get("Authorization") != "" {
		credential = "a credential!"
	}
	fmt.Fprintf(out, "   the journal: call_b37 is %s: %s %s %s, key %.8s…, %s\n", rec.State, rec.Method, rec.URL, rec.Body, rec.Key, credential)
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	report, err := rt.caller.Resume(rctx, idem.ResumeWait())
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   Resume: claimed %d, succeeded %d, unknown %d\n", report.Claimed, report.Succeeded, report.Unknown)

	// 4. The restarted runtime rebuilds the conversation.
	fmt.Fprintln(out, "\n4. The restarted runtime replays the transcript from the start.")
	before := tools.toolCalls.Load()
	for i, step := range transcript {
		fmt.Fprintf(out, "   step %d:\n", i+1)
		if err := rt.runStep(ctx, step); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "   tools/call requests sent during the replay: %d; every result came from the journal.\n", tools.toolCalls.Load()-before)

	// 5. The server's own count.
	calls := 0
	for _, s := range transcript {
		calls += len(s.Calls)
	}
	ran := tools.Runs()
	total := 0
	var counts []string
	for _, tool := range slices.Sorted(maps.Keys(ran)) {
		total += ran[tool]
		counts = append(counts, fmt.Sprintf("%s %d", tool, ran[tool]))
	}
	fmt.Fprintf(out, "\n5. %d tool calls, %d runs of the tools (%s); the server got %d tools/call requests.\n",
		calls, total, strings.Join(counts, ", "), tools.toolCalls.Load())
	for _, step := range transcript {
		for _, call := range step.Calls {
			rec, err := rt.caller.Client().Lookup(ctx, "", call.ID)
			if err != nil {
				return err
			}
			n := tools.RunsUnder(rec.Key)
			fmt.Fprintf(out, "   %s %s: key %.8s…, the tool ran %d time(s) under it\n", call.ID, call.Tool, rec.Key, n)
			if n != 1 {
				return fmt.Errorf("%s: the tool ran %d times under its key", call.ID, n)
			}
		}
	}
	if total != calls {
		return fmt.Errorf("the tools ran %d times for %d tool calls", total, calls)
	}
	return nil
}

// runtime calls tools. Each tool call is one journaled call of the Caller,
// so that a tool with side effects runs once however often the call is
// made.
type runtime struct {
	journal *idem.SQLiteJournal
	caller  *idemmcp.Caller
	out     io.Writer
}

// openRuntime opens the runtime's journal and Caller, as the runtime does
// when its process starts.
func openRuntime(journalPath, serverURL string, out io.Writer) (*runtime, error) {
	journal, err := idem.OpenSQLite(journalPath)
	if err != nil {
		return nil, err
	}
	caller, err := idemmcp.NewCaller(idemmcp.CallerConfig{
		Journal: journal,
		// The calls are journaled as POST http://office-tools.mcp.invalid/tools/{tool}:
		// `idem ls` shows them by that name.
		Server: "office-tools",
		Scope:  conversation,
		// Open connects to the server: at the first call, after a session
		// broke, and for Resume after a restart. The bearer token lives
		// here, never in the journal.
		Open: func(ctx context.Context) (*mcp.ClientSession, error) {
			client := mcp.NewClient(&mcp.Implementation{Name: "demo-runtime", Version: "1"}, nil)
			return client.Connect(ctx, &mcp.StreamableClientTransport{
				Endpoint:   serverURL,
				HTTPClient: &http.Client{Transport: bearer(agentToken)},
				// idem sends a call again, with its key; go-sdk's own
				// reconnection would only wait longer.
				MaxRetries: -1,
			}, nil)
		},
		Client: idem.Config{OnTransition: demo.PrintTransitions(out)},
	})
	if err != nil {
		journal.Close()
		return nil, err
	}
	return &runtime{journal: journal, caller: caller, out: out}, nil
}

// Close closes the Caller, then the journal.
func (rt *runtime) Close() error {
	return errors.Join(rt.caller.Close(), rt.journal.Close())
}

// runStep makes a step's tool calls in order and prints their results,
// which the runtime hands back to the model. It stops at the first call
// that has no answer; the orchestrator retries the step, or Resume
// finishes the call.
//
// The Caller names each call by the tool-call ID the model assigned: the
// ID is part of the transcript, so it is the same when a step is retried
// and when a restarted runtime replays the transcript, and it finds the
// same journaled key and result. A call ID minted per execution would make
// every retry a new call: a second e-mail.
func (rt *runtime) runStep(ctx context.Context, step Step) error {
	for _, call := range step.Calls {
		res, err := rt.caller.Call(ctx, call.ID, call.Tool, call.Args)
		if err != nil {
			return fmt.Errorf("%s %s: %w", call.ID, call.Tool, err)
		}
		// A result with IsError is the tool's answer too: the model gets
		// it, the same on every replay.
		b, err := json.Marshal(res.StructuredContent)
		if err != nil {
			return err
		}
		note := ""
		if replayed, _ := res.Meta[idemmcp.MetaReplayed].(bool); replayed {
			note = " (the server's replay of the tool's first run)"
		}
		fmt.Fprintf(rt.out, "   %s %s → %s%s\n", call.ID, call.Tool, b, note)
	}
	return nil
}

// bearer adds the agent's token to each request of the MCP session.
type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}
