package mcp

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ErrKeysNotHonoured: the server ran a tool call again when it was sent a
// second time with the same key. A Caller's promise does not hold against
// it: a call whose answer is lost runs twice.
var ErrKeysNotHonoured = errors.New("idem/mcp: the server does not honour idempotency keys")

// Verify asks whether the server honours keys for tool: it calls the tool
// twice with one new key and args, outside the journal, the second time
// on a new session from CallerConfig.Open (as a Caller sends a lost call
// again), and expects the
// second answer to be the first one replayed (MetaReplayed), and the
// first not to claim to be one. The tool runs once, or twice on a server
// that does not honour keys: give it a tool the operator marked as safe
// to call for a test. It returns nil,
// ErrKeysNotHonoured (wrapped, saying what was seen), or the error that
// kept it from telling.
func (c *Caller) Verify(ctx context.Context, tool string, args any) error {
	cs, err := c.tr.session(ctx)
	if err != nil {
		return err
	}
	key := "idem-verify-" + uuid.NewString()
	var answers [2]*mcp.CallToolResult
	for i := range answers {
		if i == 1 {
			// A Caller re-sends a lost call on a new session (a lost
			// answer is a broken session): the second call goes on one
			// too, so that keys which die with their session are told.
			if cs, err = c.tr.open(ctx); err != nil {
				return fmt.Errorf("idem/mcp: verifying tool %q, opening a second session: %w", tool, err)
			}
			defer cs.Close()
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args, Meta: mcp.Meta{MetaKey: key}})
		if err != nil {
			if i == 0 && serverError(err) == nil && !errors.Is(ctx.Err(), context.Canceled) {
				c.tr.broken(cs)
			}
			return fmt.Errorf("idem/mcp: verifying tool %q, call %d of 2: %w", tool, i+1, err)
		}
		answers[i] = res
	}
	if replayed, _ := answers[0].Meta[MetaReplayed].(bool); replayed {
		return fmt.Errorf("%w: tool %q answered the first call with the new key %s as a replay (_meta[%q]): its replay mark does not come from key handling, so a replay cannot be told from a second run",
			ErrKeysNotHonoured, tool, key, MetaReplayed)
	}
	if replayed, _ := answers[1].Meta[MetaReplayed].(bool); !replayed {
		return fmt.Errorf("%w: tool %q answered a second call with the key %s, on a new session, without _meta[%q]: it ran again, so a call whose answer is lost (and is sent again on a new session) would run twice; put the server's tools behind a Guard scoped by the caller's identity, not its session (or key handling of its own that outlives a session and marks replays)",
			ErrKeysNotHonoured, tool, key, MetaReplayed)
	}
	return nil
}
