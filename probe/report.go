package probe

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Verdict is what the probe concludes about an endpoint.
type Verdict int

const (
	// Safe: the endpoint honours keys in idem's default form (or the one
	// Config.KeyHeader named); idem needs only a status checker (see
	// Report.Advice).
	Safe Verdict = iota + 1
	// Usable: the endpoint honours keys once idem is configured as
	// Report.Advice says (another key header, quoted keys, a status
	// adapter).
	Usable
	// NotSafe: a key ran twice, or the endpoint ignores keys under every
	// header tried. Retrying a write there may repeat its effect.
	NotSafe
)

var verdictNames = [...]string{Safe: "safe", Usable: "usable", NotSafe: "not_safe"}

// String returns "safe", "usable" or "not_safe".
func (v Verdict) String() string {
	if v >= Safe && v <= NotSafe {
		return verdictNames[v]
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Describe says what v means, in a sentence for a report.
func (v Verdict) Describe() string {
	switch v {
	case Safe:
		return "safe to use with idem"
	case Usable:
		return "usable with idem, configured as advised"
	case NotSafe:
		return "not safe: a key ran twice or is ignored"
	}
	return v.String()
}

// MarshalText writes the verdict's name.
func (v Verdict) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// Grade is what one finding means for idem.
type Grade string

const (
	// GradeOK: the endpoint does what idem expects.
	GradeOK Grade = "ok"
	// GradeChange: it works once idem is configured as Report.Advice says.
	GradeChange Grade = "change"
	// GradeWarn: safe for idem, but worth knowing (another client could be
	// hurt by it).
	GradeWarn Grade = "warn"
	// GradeUnsafe: a key ran twice or was ignored.
	GradeUnsafe Grade = "unsafe"
	// GradeSkipped: the step was not run; the summary says why.
	GradeSkipped Grade = "skipped"
)

// Names of the steps, in the order they run.
const (
	StepReplay        = "replay"         // the same key twice
	StepMismatch      = "mismatch"       // the same key with another body
	StepConcurrent    = "concurrent"     // two requests with one key at once
	StepOtherEndpoint = "other-endpoint" // the key on another path or method
	StepStatus        = "status"         // the status endpoint
	StepKeyForm       = "key-form"       // the key bare and as an sf-string
)

// NotRequested is the outcome of an optional step whose input was not
// given (Config.OtherURL and OtherMethod, Config.StatusURL); it does not
// make a report incomplete. Any other skipped step has outcome "skipped".
const NotRequested = "not-requested"

// Step is announced to Config.OnStep before it sends anything.
type Step struct {
	// N numbers the steps from 1; the tries of other key forms in the
	// replay step share its number.
	N int
	// Name is one of the Step… constants.
	Name string
	// Requests is how many requests the step sends: at most, as a step
	// stops early when an answer leaves nothing more to learn.
	Requests int
	// What says what it does.
	What string
}

// Finding is what one step found.
type Finding struct {
	Step string `json:"step"`
	// Outcome is a short name of what happened, such as "replayed",
	// "executed-twice", "in-progress-409", "key-conflict".
	Outcome string `json:"outcome"`
	Grade   Grade  `json:"grade"`
	// Summary says what happened and what it means, in a sentence or two.
	Summary string `json:"summary"`
	// Requests is how many requests the step sent.
	Requests int `json:"requests"`
	// Exchanges are the requests it sent and what came back, in order
	// (the two of the concurrent step in the order they were answered).
	Exchanges []Exchange `json:"exchanges,omitempty"`
}

// Exchange is one request and its answer, as evidence. It names headers,
// never their values, except the probe's own idempotency key.
type Exchange struct {
	Method string `json:"method"`
	URL    string `json:"url"`
	// KeyHeader and KeyForm ("bare" or "sf-string") say how the key went.
	KeyHeader string `json:"key_header,omitempty"`
	KeyForm   string `json:"key_form,omitempty"`
	// Key is the probe's fresh key (a random UUID).
	Key string `json:"key,omitempty"`
	// Body says which body went: "body" or "other body"; empty for a GET.
	Body   string `json:"body,omitempty"`
	Status int    `json:"status,omitempty"`
	// ReplayHeader names the replay header the answer set to true
	// (Idempotent-Replayed, Idempotency-Replayed or X-Idempotent-Replayed).
	ReplayHeader string `json:"replay_header,omitempty"`
	// RetryAfter is the answer's Retry-After, as sent.
	RetryAfter  string `json:"retry_after,omitempty"`
	ContentType string `json:"content_type,omitempty"`
	ProblemType string `json:"problem_type,omitempty"`
	// BodyBytes and BodySHA256 (its first 16 hex digits) tell answers
	// apart without printing them.
	BodyBytes  int           `json:"body_bytes"`
	BodySHA256 string        `json:"body_sha256,omitempty"`
	Duration   time.Duration `json:"-"`
	// Error is the transport error, when there was no answer.
	Error string `json:"error,omitempty"`
	// Resent is how many times the transport sent the request again by
	// itself, on a new connection (see Config.HTTPClient): each reached
	// the endpoint, and the answer, if any, is the last one's.
	Resent int `json:"resent,omitempty"`
}

// MarshalJSON adds the duration in milliseconds.
func (e Exchange) MarshalJSON() ([]byte, error) {
	type plain Exchange
	return json.Marshal(struct {
		plain
		DurationMS float64 `json:"duration_ms"`
	}{plain(e), float64(e.Duration.Microseconds()) / 1000})
}

// Brief is the exchange on one line: "POST 201 Idempotent-Replayed 3ms".
func (e Exchange) Brief() string {
	var b strings.Builder
	b.WriteString(e.Method)
	if e.Error != "" {
		b.WriteString(" no answer")
	} else {
		fmt.Fprintf(&b, " %d", e.Status)
	}
	if e.ReplayHeader != "" {
		b.WriteString(" " + e.ReplayHeader)
	}
	if e.Resent > 0 {
		fmt.Fprintf(&b, " (re-sent %d time(s) by the transport)", e.Resent)
	}
	if e.RetryAfter != "" {
		b.WriteString(" Retry-After")
	}
	if e.ProblemType != "" {
		b.WriteString(" " + e.ProblemType)
	}
	fmt.Fprintf(&b, " %s", e.Duration.Round(time.Millisecond/10))
	return b.String()
}

// Report is what Run found.
type Report struct {
	Method string `json:"method"`
	URL    string `json:"url"`
	// Verdict is NotSafe if any finding is unsafe, else Usable if any
	// needs a change, else Safe. Skipped steps do not count: Complete is
	// false when a step was skipped for want of budget or of a usable
	// body, or because the key is not honoured (not for a step whose
	// optional input was not given).
	Verdict  Verdict   `json:"verdict"`
	Complete bool      `json:"complete"`
	Findings []Finding `json:"findings"`
	// Advice is how to configure idem for this endpoint.
	Advice Advice `json:"advice"`
	// Requests is how many requests were written to the endpoint, of
	// MaxRequests, the transport's own re-sends included.
	Requests    int `json:"requests"`
	MaxRequests int `json:"max_requests"`
}

// Finding returns the finding of the named step, if it has one.
func (r Report) Finding(step string) (Finding, bool) {
	for _, f := range r.Findings {
		if f.Step == step {
			return f, true
		}
	}
	return Finding{}, false
}

// Advice is the idem.Config fields to set for the endpoint.
type Advice struct {
	// KeyHeader is the header the endpoint reads the key from, when it is
	// not idem's default (Idempotency-Key).
	KeyHeader string `json:"key_header,omitempty"`
	// QuoteKey is true when the endpoint wants the key as an sf-string.
	QuoteKey bool `json:"quote_key,omitempty"`
	// Status is the Go expression of the status checker to use, such as
	// idem.StatusEndpoint("https://api.example.com/idempotency") or
	// idem.ReplayStatus(); empty when none works.
	Status string `json:"status,omitempty"`
	// Notes say what else to know or do.
	Notes []string `json:"notes,omitempty"`
}

// GoCode writes the advice as the idem.Config fields to set.
func (a Advice) GoCode() string {
	var b strings.Builder
	b.WriteString("idem.Config{\n")
	if a.KeyHeader != "" {
		fmt.Fprintf(&b, "\tKeyHeader: %q,\n", a.KeyHeader)
	}
	if a.QuoteKey {
		b.WriteString("\tQuoteKey:  true,\n")
	}
	if a.Status != "" {
		fmt.Fprintf(&b, "\tStatus:    %s,\n", a.Status)
	}
	b.WriteString("\t// Journal, BaseURL, Authorize, …\n}")
	return b.String()
}

// headerForm names a key form in a sentence: "Idempotency-Key (bare)".
func headerForm(header string, quoted bool) string {
	if quoted {
		return header + " (sf-string)"
	}
	return header + " (bare)"
}

func formName(quoted bool) string {
	if quoted {
		return "sf-string"
	}
	return "bare"
}

// isSuccess reports a 2xx.
func isSuccess(code int) bool { return code >= 200 && code < 300 }

// statusText is "HTTP 201", or "no answer".
func statusText(e Exchange) string {
	if e.Error != "" {
		return "no answer (" + e.Error + ")"
	}
	return fmt.Sprintf("HTTP %d", e.Status)
}
