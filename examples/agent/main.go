// Agent shows an agent runtime whose tool calls have side effects (send an
// e-mail, open a ticket) and must run exactly once, although agents retry
// and replay all the time.
//
// The runtime executes each tool call of a model's transcript through
// idem, with the tool-call ID as the operation ID. Then what really happens
// to agents happens: the ticket system is slow, the step's deadline passes
// while create_ticket runs, and the orchestrator retries the whole step;
// later the process restarts and replays the transcript from the start.
// Every tool still runs exactly once, and the replayed calls return the
// original tool results, which is what the model must see again.
//
//	go run ./examples/agent
//
// Start from this program when you build an agent runtime, an orchestrator
// or a workflow engine that executes tool calls against HTTP services.
// main.go is the runtime; tool_service.go is the demo tool service, which
// counts how many times each tool really ran.
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

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/demo"
)

var journalFlag = flag.String("journal", "", "journal file to create and keep (default: a temporary file, removed at the end)")

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
// within a conversation, so it is the scope of their operations.
const conversation = "conv_7d41"

var transcript = []Step{
	{Calls: []ToolCall{
		{ID: "call_8f2", Tool: "send_email", Args: json.RawMessage(`{"to":"customer-1042","template":"order-delayed"}`)},
	}},
	{Calls: []ToolCall{
		{ID: "call_9a1", Tool: "create_ticket", Args: json.RawMessage(`{"queue":"shipping","title":"Order ord_1042 is late"}`)},
		{ID: "call_b37", Tool: "send_email", Args: json.RawMessage(`{"to":"shipping-team","template":"ticket-opened"}`)},
	}},
}

func main() {
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	out = demo.NewSyncWriter(out)
	tmp, err := os.MkdirTemp("", "idem-agent-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	journalPath, err := demo.JournalPath(tmp, "ops.db", *journalFlag)
	if err != nil {
		return err
	}
	tools, err := startToolService()
	if err != nil {
		return err
	}
	defer tools.Close()
	fmt.Fprintf(out, "tool service on %s, journal %s, conversation %s\n", tools.URL, journalPath, conversation)

	rt, err := openRuntime(journalPath, tools.URL, out)
	if err != nil {
		return err
	}
	defer rt.Close()

	// 1. Step 1 runs normally.
	fmt.Fprintln(out, "\n1. Step 1: the model calls send_email (call_8f2).")
	if err := rt.runStep(ctx, transcript[0]); err != nil {
		return err
	}

	// 2. Step 2 times out while create_ticket runs: the ticket system is
	// slow, and the orchestrator gives up on the step.
	fmt.Fprintln(out, "\n2. Step 2: the model calls create_ticket (call_9a1), then send_email (call_b37).")
	fmt.Fprintln(out, "   The ticket system is slow: it opens the ticket, and the step's deadline passes before it answers.")
	started, release := tools.SlowNext("create_ticket")
	defer release()
	stepCtx, timeout := context.WithCancel(ctx) // stands for the step's deadline
	go func() {
		select {
		case <-started:
			timeout()
		case <-stepCtx.Done():
		}
	}()
	err = rt.runStep(stepCtx, transcript[1])
	timeout()
	if !errors.Is(err, idem.ErrOutcomeUnknown) {
		return fmt.Errorf("step 2 under a deadline: want an unknown outcome, got %v", err)
	}
	fmt.Fprintln(out, "   Step 2 failed: call_9a1 has an unknown outcome (the ticket may exist).")
	release() // the ticket system answers, late, to nobody

	fmt.Fprintln(out, "\n   The orchestrator retries the whole step 2. call_9a1 is journaled as unknown, so Do first asks")
	fmt.Fprintln(out, "   the tool service what became of it; call_b37 was never sent, so it is sent now.")
	if err := rt.runStep(ctx, transcript[1]); err != nil {
		return err
	}

	// 3. The process restarts and replays the transcript from the start,
	// as runtimes do to rebuild a conversation's state.
	fmt.Fprintln(out, "\n3. The process restarts and replays the transcript from the start.")
	if err := rt.Close(); err != nil {
		return err
	}
	before := tools.ToolRequests()
	if err := replay(ctx, out, journalPath, tools.URL); err != nil {
		return err
	}
	fmt.Fprintf(out, "   Tool requests sent during the replay: %d; every result came from the journal.\n", tools.ToolRequests()-before)

	// 4. The tool service's own count.
	calls := 0
	for _, s := range transcript {
		calls += len(s.Calls)
	}
	ran := tools.Executions()
	total := 0
	var counts []string
	for _, tool := range slices.Sorted(maps.Keys(ran)) {
		total += ran[tool]
		counts = append(counts, fmt.Sprintf("%s %d", tool, ran[tool]))
	}
	fmt.Fprintf(out, "\n4. %d tool calls, %d executions on the tool service (%s).\n", calls, total, strings.Join(counts, ", "))
	if total != calls {
		return fmt.Errorf("the tool service ran %d times for %d tool calls", total, calls)
	}
	return nil
}

// replay is a restarted runtime rebuilding a conversation: it opens the
// journal and executes the transcript again from the start.
func replay(ctx context.Context, out io.Writer, journalPath, toolsURL string) error {
	rt, err := openRuntime(journalPath, toolsURL, out)
	if err != nil {
		return err
	}
	defer rt.Close()
	for i, step := range transcript {
		fmt.Fprintf(out, "   step %d:\n", i+1)
		if err := rt.runStep(ctx, step); err != nil {
			return err
		}
	}
	return nil
}

// runtime executes tool calls. Each call is one idem operation, so that a
// tool with side effects runs once however often its call is executed.
type runtime struct {
	journal *idem.SQLiteJournal
	client  *idem.Client
	out     io.Writer
}

// openRuntime opens the runtime's journal and client, as the runtime does
// when its process starts.
func openRuntime(journalPath, toolsURL string, out io.Writer) (*runtime, error) {
	journal, err := idem.OpenSQLite(journalPath)
	if err != nil {
		return nil, err
	}
	client, err := idem.New(idem.Config{
		Journal: journal,
		BaseURL: toolsURL,
		// When a tool's answer is lost, ask the service what became of the
		// key instead of running the tool again.
		Status:       idem.StatusEndpoint(toolsURL + "/idempotency"),
		OnTransition: demo.PrintTransitions(out),
	})
	if err != nil {
		journal.Close()
		return nil, err
	}
	return &runtime{journal: journal, client: client, out: out}, nil
}

// Close closes the client, then the journal. It may be called more than
// once.
func (rt *runtime) Close() error {
	return errors.Join(rt.client.Close(), rt.journal.Close())
}

// runStep executes a step's tool calls in order and prints their results,
// which the runtime would hand back to the model. It stops at the first
// call that has no definitive answer; the orchestrator retries the step.
func (rt *runtime) runStep(ctx context.Context, step Step) error {
	for _, call := range step.Calls {
		result, err := rt.execute(ctx, call)
		if err != nil {
			return fmt.Errorf("%s %s: %w", call.ID, call.Tool, err)
		}
		fmt.Fprintf(rt.out, "   %s %s → %s\n", call.ID, call.Tool, result)
	}
	return nil
}

// execute runs one tool call and returns the tool's answer.
//
// The operation ID is the tool-call ID the model assigned, not a UUID
// minted here: the ID is part of the transcript, so it is the same when
// the orchestrator retries a step and when a restarted process replays the
// transcript, and the same ID finds the same journaled key and result. A
// UUID minted per execution would make every retry and every replay a new
// operation: a second e-mail, a second ticket. The scope is the
// conversation, because tool-call IDs are unique only within one.
func (rt *runtime) execute(ctx context.Context, call ToolCall) (json.RawMessage, error) {
	res, err := rt.client.Do(ctx, idem.Op{
		Scope:  conversation,
		ID:     "tool/" + call.ID,
		Method: http.MethodPost,
		URL:    "/tools/" + call.Tool,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   call.Args,
	})
	switch {
	case err == nil, errors.Is(err, idem.ErrRejected):
		// A definitive answer, success or refusal, is the tool's result:
		// the model gets it, and gets the same one on every replay.
		return res.Body, nil
	default:
		// Not definitive: the call is journaled, and executing it again
		// (a step retry, a replay, Resume) settles it without a second run.
		return nil, err
	}
}
