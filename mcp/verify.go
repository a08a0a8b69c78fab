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
// twice with one new key and args, outside the journal, and expects the
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
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args, Meta: mcp.Meta{MetaKey: key}})
		if err != nil {
			if serverError(err) == nil && !errors.Is(ctx.Err(), context.Canceled) {
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
		return fmt.Errorf("%w: tool %q answered a second call with the key %s without _meta[%q]: it ran again, so a call whose answer is lost would run twice; put the server's tools behind a Guard (or its own key handling that marks replays)",
			ErrKeysNotHonoured, tool, key, MetaReplayed)
	}
	return nil
}
