package mcp_test

import (
	"context"
	"fmt"
	"log"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkit/idem"
	idemmcp "github.com/idemkit/idem/mcp"
	"github.com/idemkit/idem/server"
)

type mail struct {
	To string `json:"to"`
}

type sent struct {
	MessageID string `json:"message_id"`
}

// newMailServer is a go-sdk server whose send_email runs at most once per
// key, behind a Guard; runs counts the e-mails it sent.
func newMailServer(runs *int) (*mcp.Server, *idemmcp.Guard) {
	guard, err := idemmcp.NewGuard(idemmcp.GuardConfig{
		Store: server.NewMemoryStore(), // server.OpenSQLiteStore, postgres.OpenStore...
		Tools: []string{"send_email"},
		// The caller's identity: on streamable HTTP with bearer tokens,
		// leave it unset (the token's user); here, one client.
		Scope: func(context.Context, *mcp.CallToolRequest) string { return "the-agent" },
	})
	if err != nil {
		log.Fatal(err)
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "send_email"}, func(_ context.Context, _ *mcp.CallToolRequest, in mail) (*mcp.CallToolResult, sent, error) {
		*runs++
		return nil, sent{MessageID: fmt.Sprintf("msg-%d", *runs)}, nil
	})
	srv.AddReceivingMiddleware(guard.Middleware)
	return srv, guard
}

// A server's tool behind a Guard: the second call with the same key is
// answered from the store, marked replayed, and the e-mail goes once.
func Example_guard() {
	ctx := context.Background()
	var runs int
	srv, guard := newMailServer(&runs)
	defer guard.Close()

	st, ct := mcp.NewInMemoryTransports()
	if _, err := srv.Connect(ctx, st, nil); err != nil {
		log.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer cs.Close()

	for range 2 {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{
			Name:      "send_email",
			Arguments: mail{To: "ann@example.com"},
			Meta:      mcp.Meta{idemmcp.MetaKey: "call_8f2"}, // one key per logical call
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(res.StructuredContent, "replayed:", res.Meta[idemmcp.MetaReplayed] == true)
	}
	fmt.Println("e-mails sent:", runs)
	// Output:
	// map[message_id:msg-1] replayed: false
	// map[message_id:msg-1] replayed: true
	// e-mails sent: 1
}

// A runtime's tool calls through a Caller: each call is journaled under
// its tool-call ID before it is sent; the same ID again is answered from
// the journal, so a retried step or a replayed transcript sends no second
// e-mail. After a crash, Resume finishes the calls left pending.
func Example_caller() {
	ctx := context.Background()
	var runs int
	srv, guard := newMailServer(&runs)
	defer guard.Close()

	journal := idem.NewMemoryJournal() // idem.OpenSQLite(path) in a runtime that restarts
	caller, err := idemmcp.NewCaller(idemmcp.CallerConfig{
		Journal: journal,
		Server:  "mail",       // journaled as POST http://mail.mcp.invalid/tools/{tool}
		Scope:   "user:alice", // whose credentials Open connects with
		// Open connects a session: at the first call, after one broke,
		// and for Resume after a restart.
		Open: func(ctx context.Context) (*mcp.ClientSession, error) {
			st, ct := mcp.NewInMemoryTransports()
			if _, err := srv.Connect(ctx, st, nil); err != nil {
				return nil, err
			}
			return mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, ct, nil)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer caller.Close()
	if _, err := caller.Resume(ctx); err != nil { // at start-up: what a crash left
		log.Fatal(err)
	}

	for range 2 {
		res, err := caller.Call(ctx, "call_8f2", "send_email", mail{To: "ann@example.com"})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(res.StructuredContent)
	}
	rec, err := caller.Client().Lookup(ctx, "", "call_8f2")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("journal:", rec.State, rec.Method, rec.URL, string(rec.Body))
	fmt.Println("e-mails sent:", runs)
	// Output:
	// map[message_id:msg-1]
	// map[message_id:msg-1]
	// journal: succeeded POST http://mail.mcp.invalid/tools/send_email {"to":"ann@example.com"}
	// e-mails sent: 1
}
