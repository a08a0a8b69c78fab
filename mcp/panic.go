package mcp

import (
	"fmt"
	"net/http"
	"runtime/debug"
)

// PanicError is what a guarded tool's panic goes on as, out of the Guard,
// when it panicked in a call's first round. The Guard recovers that panic
// to store the failure as the key's outcome (the tool may have acted
// before it failed, so it is not run again for the key), then raises it
// again: raised as the bare value, the stack printed when the process ends
// would be the Guard's, not the tool's. Value is what the tool panicked
// with; Stack, the tool's goroutine stack where it panicked. Printed
// (Error), it shows both. A tool that panics with http.ErrAbortHandler,
// meant to abort quietly, has it go on as itself.
type PanicError struct {
	Tool  string
	Value any
	Stack []byte
}

func (p *PanicError) Error() string {
	return fmt.Sprintf("idem/mcp: tool %q panicked: %v\n\n%s", p.Tool, p.Value, p.Stack)
}

// Unwrap returns Value when it is an error, so that errors.Is and
// errors.As reach it.
func (p *PanicError) Unwrap() error {
	err, _ := p.Value.(error)
	return err
}

// newPanic is the value a recovered panic v of tool goes on as; it is
// called in the recovering defer, where the stack is still the tool's.
func newPanic(tool string, v any) any {
	if v == http.ErrAbortHandler {
		return v
	}
	return &PanicError{Tool: tool, Value: v, Stack: debug.Stack()}
}
