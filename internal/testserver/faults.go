package testserver

import (
	"fmt"
	"time"
)

type faultKind int

const (
	faultDropBeforeHandler faultKind = iota + 1
	faultDropAfterCommit
	faultHoldPastTimeout
	faultServerErrorBeforeCommit
	faultUnavailableBeforeCommit
	faultTooManyRequests
	faultServerErrorAfterCommit
	faultResetMidBody
	faultSlowHandler
	faultStallMidBody
)

// Fault is what the server does to one POST /orders request instead of
// answering it normally. "Before commit" faults answer before the
// middleware sees the request: nothing is stored or executed. "After
// commit" faults let the middleware run the order and store the response,
// then keep the client from getting it.
type Fault struct {
	kind  faultKind
	delay time.Duration
}

var (
	// DropBeforeHandler reads the request, then closes the connection with
	// no response; nothing is stored or executed.
	DropBeforeHandler = Fault{kind: faultDropBeforeHandler}
	// DropAfterCommit creates the order and stores the response, then
	// closes the connection without a response.
	DropAfterCommit = Fault{kind: faultDropAfterCommit}
	// HoldPastTimeout creates the order and stores the response, then holds
	// the answer until the client gives up (its request context ends), and
	// drops the connection.
	HoldPastTimeout = Fault{kind: faultHoldPastTimeout}
	// ServerErrorBeforeCommit answers 500; nothing is executed.
	ServerErrorBeforeCommit = Fault{kind: faultServerErrorBeforeCommit}
	// UnavailableBeforeCommit answers 503 with Retry-After: 1; nothing is
	// executed.
	UnavailableBeforeCommit = Fault{kind: faultUnavailableBeforeCommit}
	// TooManyRequests answers 429 with Retry-After: 1; nothing is executed.
	TooManyRequests = Fault{kind: faultTooManyRequests}
	// ServerErrorAfterCommit creates the order and stores the response,
	// then answers 500 instead, like a proxy failing after the upstream
	// committed.
	ServerErrorAfterCommit = Fault{kind: faultServerErrorAfterCommit}
	// ResetMidBody creates the order and stores the response, sends the
	// status line, the headers and half the body, then resets the TCP
	// connection.
	ResetMidBody = Fault{kind: faultResetMidBody}
	// StallMidBody creates the order and stores the response, sends the
	// status line, the headers and half the body, then sends nothing more
	// until the client closes the connection.
	StallMidBody = Fault{kind: faultStallMidBody}
)

// SlowHandler makes the handler wait d before it creates the order, under
// the claimed key, so that concurrent attempts with the key get 409.
func SlowHandler(d time.Duration) Fault { return Fault{kind: faultSlowHandler, delay: d} }

func (f Fault) String() string {
	switch f.kind {
	case faultDropBeforeHandler:
		return "DropBeforeHandler"
	case faultDropAfterCommit:
		return "DropAfterCommit"
	case faultHoldPastTimeout:
		return "HoldPastTimeout"
	case faultServerErrorBeforeCommit:
		return "ServerErrorBeforeCommit"
	case faultUnavailableBeforeCommit:
		return "UnavailableBeforeCommit"
	case faultTooManyRequests:
		return "TooManyRequests"
	case faultServerErrorAfterCommit:
		return "ServerErrorAfterCommit"
	case faultResetMidBody:
		return "ResetMidBody"
	case faultStallMidBody:
		return "StallMidBody"
	case faultSlowHandler:
		return fmt.Sprintf("SlowHandler(%s)", f.delay)
	}
	return "NoFault"
}

type statusFaultKind int

const (
	statusFaultDown statusFaultKind = iota + 1
	statusFaultHang
	statusFaultGarbage
)

// StatusFault is what the server does to one status request instead of
// answering it.
type StatusFault struct{ kind statusFaultKind }

var (
	// StatusDown answers 500.
	StatusDown = StatusFault{statusFaultDown}
	// StatusHang answers nothing until the client gives up.
	StatusHang = StatusFault{statusFaultHang}
	// StatusGarbage answers 200 with a body that is not JSON.
	StatusGarbage = StatusFault{statusFaultGarbage}
)

func (f StatusFault) String() string {
	switch f.kind {
	case statusFaultDown:
		return "StatusDown"
	case statusFaultHang:
		return "StatusHang"
	case statusFaultGarbage:
		return "StatusGarbage"
	}
	return "NoStatusFault"
}
