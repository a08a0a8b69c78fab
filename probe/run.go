package probe

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/wire"
)

// Run probes the endpoint cfg names and reports what it does with keys.
// It sends real requests, which may have real effects (orders created,
// cards charged): at most cfg.MaxRequests, each step announced to
// cfg.OnStep with the number it sends.
//
// The error is an *AnswerError when the endpoint refuses the first request
// (fix the body, the credentials or the URL), wraps ErrInvalidConfig for a
// bad cfg, or is the context's or the transport's on the first request.
// The report holds whatever was found before the error. Run is safe for
// concurrent use; each call probes on its own.
func Run(ctx context.Context, cfg Config) (Report, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return Report{}, err
	}
	p := &prober{cfg: c}
	r := &run{p: p, main: target{c.Method, c.URL}}
	rep := Report{Method: c.Method, URL: c.URL, MaxRequests: c.MaxRequests}
	err = r.all(ctx)
	rep.Findings = r.findings
	rep.Requests = p.sent
	rep.Complete = err == nil
	rep.Verdict = Safe
	for _, f := range rep.Findings {
		switch f.Grade {
		case GradeUnsafe:
			rep.Verdict = NotSafe
		case GradeChange:
			rep.Verdict = max(rep.Verdict, Usable)
		case GradeSkipped:
			rep.Complete = rep.Complete && f.Outcome == NotRequested
		}
	}
	rep.Advice = r.advice()
	return rep, err
}

// run is the state of one Run: what the steps found, which later steps use.
type run struct {
	p        *prober
	main     target
	findings []Finding
	n        int // the step number
	// form is the key form the endpoint honours, once the replay step
	// found it; honoured is false when it found none.
	form     form
	honoured bool
	// replayWorks: a repeat of a request with its key gets its answer, so
	// idem.ReplayStatus settles unknown outcomes.
	replayWorks bool
	// usedKey is a key the endpoint completed, for the status step.
	usedKey string
	// refused lists the key forms the endpoint refused on a first request.
	refused []string
	// status is the advised status checker, from the status step.
	status string
	notes  []string
}

// announce numbers a step and tells OnStep; the tries of one step share
// its number when same is true.
func (r *run) announce(name string, requests int, what string, same bool) {
	if !same {
		r.n++
	}
	if r.p.cfg.OnStep != nil {
		r.p.cfg.OnStep(Step{N: r.n, Name: name, Requests: requests, What: what})
	}
}

// afford reports whether the budget allows a step of k requests, and when
// not records it as skipped.
func (r *run) afford(name, what string, k int) bool {
	if left := r.p.remaining(); left < k {
		r.n++
		r.add(Finding{Step: name, Outcome: "skipped", Grade: GradeSkipped,
			Summary: fmt.Sprintf("Not run (%s): it sends %d requests, and %d of the %d allowed (MaxRequests) are left.", what, k, left, r.p.cfg.MaxRequests)})
		return false
	}
	return true
}

func (r *run) add(f Finding) { r.findings = append(r.findings, f) }

func (r *run) skip(name, why string) {
	r.add(Finding{Step: name, Outcome: "skipped", Grade: GradeSkipped, Summary: why})
}

func exchanges(as ...answer) []Exchange {
	out := make([]Exchange, len(as))
	for i, a := range as {
		out[i] = a.Exchange
	}
	return out
}

func (r *run) all(ctx context.Context) error {
	if err := r.replay(ctx); err != nil {
		return err
	}
	if !r.honoured {
		why := "Not run: the key is not honoured (see the replay step), so this step would only repeat effects."
		for _, s := range []string{StepMismatch, StepConcurrent, StepOtherEndpoint, StepStatus, StepKeyForm} {
			r.skip(s, why)
		}
		return nil
	}
	for _, step := range []func(context.Context) error{r.mismatch, r.concurrent, r.otherEndpoint, r.statusEndpoint, r.keyForm} {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := step(ctx); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// candidates are the key forms to try after f was refused on a first
// request: f quoted, then the other header names, bare.
func (r *run) candidates(f form) []form {
	var out []form
	if !f.quoted {
		out = append(out, form{f.header, true})
	}
	for _, h := range keyHeaders {
		if h != f.header {
			out = append(out, form{h, false})
		}
	}
	return out
}

// replay sends the same key twice, and finds the key form the endpoint
// honours.
func (r *run) replay(ctx context.Context) error {
	f := form{r.p.cfg.KeyHeader, false}
	body := r.p.cfg.Body
	r.announce(StepReplay, 2, "the same key twice, in "+f.String(), false)
	key := newKey()
	first := r.p.send(ctx, r.main, f, key, body, "body")
	var sent []answer
	sent = append(sent, first)
	// A first request refused as a request (400, 422, 428) may be a key
	// form the endpoint does not read: try the others, one request each.
	tried := []string{f.String()}
	for !first.ok() && first.Error == "" && refusesForm(first.Status) {
		r.refused = append(r.refused, fmt.Sprintf("%s: HTTP %d%s", f, first.Status, problemNote(first)))
		next, ok := form{}, false
		for _, c := range r.candidates(form{r.p.cfg.KeyHeader, false}) {
			if !slices.Contains(tried, c.String()) {
				next, ok = c, true
				break
			}
		}
		if !ok || r.p.remaining() < 2 {
			break
		}
		f = next
		tried = append(tried, f.String())
		r.announce(StepReplay, 1, fmt.Sprintf("HTTP %d: the first request again, key in %s", first.Status, f), true)
		key = newKey()
		first = r.p.send(ctx, r.main, f, key, body, "body")
		sent = append(sent, first)
	}
	if !first.ok() {
		r.add(Finding{Step: StepReplay, Outcome: "first-request-refused", Grade: GradeSkipped, Requests: len(sent),
			Summary: "The first request was refused: nothing could be learned.", Exchanges: exchanges(sent...)})
		if first.Error != "" {
			return fmt.Errorf("probe: %s %s: %s", first.Method, first.URL, first.Error)
		}
		return &AnswerError{Exchange: first.Exchange, Tried: tried, Hint: hint(first), Excerpt: r.p.excerpt(first.body)}
	}
	second := r.p.send(ctx, r.main, f, key, body, "body")
	sent = append(sent, second)
	fd := Finding{Step: StepReplay, Requests: len(sent), Exchanges: exchanges(sent...)}
	var prefix string
	if len(r.refused) > 0 {
		prefix = fmt.Sprintf("Refused with the key in %s; accepted in %s. ", strings.Join(r.refused, ", then "), f)
	}
	switch {
	case second.replayed() || second.sameAs(first):
		r.honoured, r.replayWorks, r.form, r.usedKey = true, true, f, key
		fd.Outcome, fd.Grade = "replayed", GradeOK
		fd.Summary = prefix + describeReplay(first, second, f)
		if f.header != wire.KeyHeader || f.quoted {
			fd.Grade = GradeChange
		}
	case second.ok():
		// Two successes that differ, neither marked replayed: the key is
		// ignored in this form. Try the other header names.
		fd.Outcome, fd.Grade = "executed-twice", GradeUnsafe
		fd.Summary = prefix + fmt.Sprintf("Executed twice with the key in %s: two different answers (%s, %s), neither marked replayed.", f, statusText(first.Exchange), statusText(second.Exchange))
		r.add(fd)
		return r.otherHeaders(ctx, f, body)
	default:
		// A repeat refused: the key is kept, but its answer does not come
		// back, so only a status endpoint can settle an unknown outcome.
		r.honoured, r.form, r.usedKey = true, f, key
		d := idem.Classify(idem.Attempt{Response: &http.Response{StatusCode: second.Status, Header: second.header}, Body: second.body, Written: true})
		fd.Outcome, fd.Grade = "repeat-refused", GradeChange
		fd.Summary = prefix + fmt.Sprintf("The key is kept, but a repeat is refused (%s, which idem.Classify reads as %s), not replayed: idem.ReplayStatus cannot settle an unknown outcome here; a status endpoint must.", statusText(second.Exchange), d.Verdict)
		if second.Error != "" {
			fd.Outcome, fd.Grade = "repeat-unanswered", GradeWarn
			fd.Summary = prefix + "The repeat got no answer: " + second.Error
		}
	}
	r.add(fd)
	return nil
}

// refusesForm reports a status with which servers refuse a request whose
// key is missing or malformed.
func refusesForm(code int) bool {
	return code == http.StatusBadRequest || code == http.StatusUnprocessableEntity || code == http.StatusPreconditionRequired
}

// hint says what to fix after a refused first request.
func hint(a answer) string {
	switch code := a.Status; {
	case code == http.StatusUnauthorized, code == http.StatusForbidden, code == http.StatusProxyAuthRequired:
		return "the credentials are missing or refused: set them in Config.Header (idem probe --header-env NAME=ENV)"
	case code == http.StatusNotFound, code == http.StatusMethodNotAllowed:
		return "check the URL and the method"
	case code >= 300 && code < 400:
		return fmt.Sprintf("it redirects (to %q), and the probe follows no redirect: give the final URL", a.header.Get("Location"))
	case refusesForm(code), code == http.StatusUnsupportedMediaType:
		return "fix the request body (Config.Body; idem probe --body or --body-file) or the key's header (Config.KeyHeader; idem probe --key-header)"
	case code == http.StatusConflict, code == http.StatusTooManyRequests, code >= 500:
		return "the server is busy or failing; try again later"
	}
	return "the endpoint must accept the request with a 2xx before its keys can be probed"
}

func describeReplay(first, second answer, f form) string {
	var parts []string
	if second.ReplayHeader != "" {
		parts = append(parts, "marked "+second.ReplayHeader+": true")
	} else {
		parts = append(parts, "no replay header")
	}
	if second.Status == first.Status {
		parts = append(parts, fmt.Sprintf("the same status (%d)", first.Status))
	} else {
		parts = append(parts, fmt.Sprintf("another status (%d, then %d)", first.Status, second.Status))
	}
	if second.sameAs(first) || (second.Status != first.Status && string(second.body) == string(first.body)) {
		parts = append(parts, "the same body")
	} else {
		parts = append(parts, "another body")
	}
	s := fmt.Sprintf("Replayed with the key in %s: %s.", f, strings.Join(parts, ", "))
	if second.ReplayHeader == "" {
		s += " Taken for a replay because the answers are identical; an endpoint whose every answer is the same cannot be told apart from one that ran twice."
	}
	return s
}

// otherHeaders tries the key in the other header names, two requests
// each, after it was ignored in f.
func (r *run) otherHeaders(ctx context.Context, ignored form, body []byte) error {
	var tried []string
	for _, h := range keyHeaders {
		if h == ignored.header {
			continue
		}
		f := form{h, false}
		if r.p.remaining() < 2 {
			r.add(Finding{Step: StepReplay, Outcome: "skipped", Grade: GradeSkipped,
				Summary: fmt.Sprintf("The key in %s was not tried: it sends 2 requests, and %d are left (MaxRequests).", f, r.p.remaining())})
			break
		}
		r.announce(StepReplay, 2, "the same key twice, in "+f.String(), true)
		key := newKey()
		first := r.p.send(ctx, r.main, f, key, body, "body")
		second := first
		if first.ok() {
			second = r.p.send(ctx, r.main, f, key, body, "body")
		}
		sent := []answer{first}
		if second.Exchange != first.Exchange {
			sent = append(sent, second)
		}
		fd := Finding{Step: StepReplay, Requests: len(sent), Exchanges: exchanges(sent...)}
		tried = append(tried, f.String())
		switch {
		case first.ok() && (second.replayed() || second.sameAs(first)):
			r.honoured, r.replayWorks, r.form, r.usedKey = true, true, f, key
			fd.Outcome, fd.Grade = "replayed", GradeChange
			fd.Summary = fmt.Sprintf("%s is ignored; %s is honoured. ", ignored.header, h) + describeReplay(first, second, f)
			r.add(fd)
			return nil
		case !first.ok():
			fd.Outcome, fd.Grade = "refused", GradeSkipped
			fd.Summary = fmt.Sprintf("With the key in %s the request was refused (%s).", f, statusText(first.Exchange))
		default:
			fd.Outcome, fd.Grade = "executed-twice", GradeUnsafe
			fd.Summary = fmt.Sprintf("Executed twice with the key in %s as well.", f)
		}
		r.add(fd)
	}
	r.notes = append(r.notes, fmt.Sprintf("The key is ignored in %s and in %s: every retry of a write may repeat it. Do not retry writes to this endpoint until it honours keys.",
		ignored.header, strings.Join(tried, ", ")))
	return nil
}

// mismatch sends one key with the body, then with another body.
func (r *run) mismatch(ctx context.Context) error {
	const what = "the same key with another body"
	other := r.p.cfg.OtherBody
	if other == nil {
		var err error
		if other, err = otherBody(r.p.cfg.Body); err != nil {
			r.n++
			r.skip(StepMismatch, "Not run: "+err.Error())
			return nil
		}
	}
	if !r.afford(StepMismatch, what, 2) {
		return nil
	}
	r.announce(StepMismatch, 2, what, false)
	key := newKey()
	first := r.p.send(ctx, r.main, r.form, key, r.p.cfg.Body, "body")
	if !first.ok() {
		r.add(Finding{Step: StepMismatch, Outcome: "first-request-refused", Grade: GradeWarn, Requests: 1, Exchanges: exchanges(first),
			Summary: fmt.Sprintf("The first request, with a fresh key, got %s: the step stopped there.", statusText(first.Exchange))})
		return nil
	}
	second := r.p.send(ctx, r.main, r.form, key, other, "other body")
	fd := Finding{Step: StepMismatch, Requests: 2, Exchanges: exchanges(first, second)}
	d := classify(second)
	switch {
	case second.Error != "":
		fd.Outcome, fd.Grade, fd.Summary = "unanswered", GradeWarn, "The request with the other body got no answer: "+second.Error
	case d.Verdict == idem.KeyConflict:
		fd.Outcome, fd.Grade = "key-conflict", GradeOK
		fd.Summary = "Refused: " + d.Reason + "; idem.Classify recognises it (ErrKeyConflict)."
	case second.replayed() || second.sameAs(first):
		fd.Outcome, fd.Grade = "replayed-first", GradeWarn
		fd.Summary = "Silently replayed the first answer: the endpoint does not compare payloads. idem never reuses a key for another request (ErrFingerprintMismatch), but another client could get the answer of a request it did not send."
	case second.ok():
		fd.Outcome, fd.Grade = "executed-new", GradeWarn
		fd.Summary = "Executed as a new request: the endpoint keys by the payload too. idem re-sends byte-identical requests, so its retries replay; another client reusing a key would act again."
	case second.Status == http.StatusConflict && d.Verdict == idem.InProgress:
		fd.Outcome, fd.Grade = "refused", GradeWarn
		fd.Summary = "Refused with a 409 that names no key conflict idem.Classify knows: idem would read it as \"in progress\" and ask the status. idem never sends another request under a key, so this only matters to other clients."
	default:
		fd.Outcome, fd.Grade = "refused", GradeOK
		fd.Summary = fmt.Sprintf("Refused (%s%s), in a form idem.Classify does not name a key conflict: idem reports it as ErrRejected, a refusal never re-sent.", statusText(second.Exchange), problemNote(second))
	}
	r.add(fd)
	return nil
}

func problemNote(a answer) string {
	if a.ProblemType != "" {
		return ", problem type " + a.ProblemType
	}
	return ""
}

func classify(a answer) idem.Decision {
	if a.Error != "" {
		return idem.Decision{Verdict: idem.Unknown}
	}
	return idem.Classify(idem.Attempt{Response: &http.Response{StatusCode: a.Status, Header: a.header}, Body: a.body, Written: true})
}

// concurrent sends two requests with one key at once.
func (r *run) concurrent(ctx context.Context) error {
	const what = "two requests with one key at once"
	if !r.afford(StepConcurrent, what, 2) {
		return nil
	}
	r.announce(StepConcurrent, 2, what, false)
	key := newKey()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		answers []answer
		start   = make(chan struct{})
	)
	for range 2 {
		wg.Go(func() {
			<-start
			a := r.p.send(ctx, r.main, r.form, key, r.p.cfg.Body, "body")
			mu.Lock()
			answers = append(answers, a)
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	a, b := answers[0], answers[1]
	fd := Finding{Step: StepConcurrent, Requests: 2, Exchanges: exchanges(a, b)}
	timing := fmt.Sprintf(" Answered in %s and %s.", a.Duration.Round(100_000), b.Duration.Round(100_000))
	inProgress := func(x answer) bool { return x.Status == http.StatusConflict && classify(x).Verdict == idem.InProgress }
	switch {
	case a.ok() && b.ok() && (a.replayed() || b.replayed() || a.sameAs(b)):
		fd.Outcome, fd.Grade = "one-execution", GradeOK
		fd.Summary = "Both answered, with one execution: the later answer repeats the first (" + replayNote(a, b) + "). The server waited for the first, or it had finished before the second arrived." + timing
	case a.ok() && b.ok():
		fd.Outcome, fd.Grade = "executed-twice", GradeUnsafe
		fd.Summary = "Executed twice: two different answers to one key, neither marked replayed. Concurrent retries (or a retry while the first attempt runs) repeat the effect." + timing
	case a.ok() && inProgress(b), b.ok() && inProgress(a):
		busy := a
		if !inProgress(a) {
			busy = b
		}
		fd.Outcome, fd.Grade = "in-progress-409", GradeOK
		fd.Summary = "One ran; the other got 409 while it ran"
		if busy.RetryAfter != "" {
			fd.Summary += ", with Retry-After: " + busy.RetryAfter
		} else {
			fd.Summary += ", without Retry-After"
		}
		fd.Summary += problemNote(busy) + ". idem waits, then checks the status." + timing
	default:
		fd.Outcome, fd.Grade = "unexpected", GradeWarn
		fd.Summary = fmt.Sprintf("Answered %s and %s: not a pattern the probe knows; check the server's logs for how many ran.", statusText(a.Exchange), statusText(b.Exchange)) + timing
	}
	r.add(fd)
	return nil
}

func replayNote(a, b answer) string {
	for _, x := range []answer{a, b} {
		if x.ReplayHeader != "" {
			return "marked " + x.ReplayHeader
		}
	}
	return "identical, no replay header"
}

// otherEndpoint sends a key to the main endpoint, then to the other one.
func (r *run) otherEndpoint(ctx context.Context) error {
	const what = "one key on this endpoint, then on the other"
	c := r.p.cfg
	if c.OtherURL == "" && c.OtherMethod == "" {
		r.n++
		r.add(Finding{Step: StepOtherEndpoint, Outcome: NotRequested, Grade: GradeSkipped,
			Summary: "Not run: no other endpoint given (Config.OtherURL, OtherMethod; idem probe --other-url, --other-method)."})
		return nil
	}
	other := target{c.Method, c.URL}
	if c.OtherMethod != "" {
		other.method = c.OtherMethod
	}
	if c.OtherURL != "" {
		other.url = c.OtherURL
	}
	if other == r.main {
		r.n++
		r.skip(StepOtherEndpoint, "Not run: the other endpoint is this one.")
		return nil
	}
	if !r.afford(StepOtherEndpoint, what, 2) {
		return nil
	}
	r.announce(StepOtherEndpoint, 2, fmt.Sprintf("one key on %s %s, then on %s %s", r.main.method, r.main.url, other.method, other.url), false)
	key := newKey()
	first := r.p.send(ctx, r.main, r.form, key, c.Body, "body")
	if !first.ok() {
		r.add(Finding{Step: StepOtherEndpoint, Outcome: "first-request-refused", Grade: GradeWarn, Requests: 1, Exchanges: exchanges(first),
			Summary: fmt.Sprintf("The first request, with a fresh key, got %s: the step stopped there.", statusText(first.Exchange))})
		return nil
	}
	var body []byte
	if other.method != http.MethodGet && other.method != http.MethodHead {
		body = c.Body
	}
	second := r.p.send(ctx, other, r.form, key, body, "body")
	fd := Finding{Step: StepOtherEndpoint, Requests: 2, Exchanges: exchanges(first, second)}
	d := classify(second)
	switch {
	case second.Error != "":
		fd.Outcome, fd.Grade, fd.Summary = "unanswered", GradeWarn, "The other endpoint gave no answer: "+second.Error
	case d.Verdict == idem.KeyConflict:
		fd.Outcome, fd.Grade = "same-entry-refused", GradeOK
		fd.Summary = "The same entry: the other endpoint refused the used key (" + d.Reason + "). Keys are not shared silently between endpoints."
	case second.replayed() || second.sameAs(first):
		fd.Outcome, fd.Grade = "same-entry-replayed", GradeWarn
		fd.Summary = "The same entry: the other endpoint replayed this one's answer. The server keys by the key alone; idem uses one key per operation, never across endpoints, but never share keys between calls."
	case second.ok():
		fd.Outcome, fd.Grade = "new-entry", GradeOK
		fd.Summary = "A new entry: the other endpoint ran the request as its own. The server scopes keys by method and path."
	default:
		fd.Outcome, fd.Grade = "refused", GradeWarn
		fd.Summary = fmt.Sprintf("The other endpoint answered %s%s, not a key conflict idem recognises: check that it accepts this request.", statusText(second.Exchange), problemNote(second))
	}
	r.add(fd)
	return nil
}

// statusEndpoint asks the status endpoint about a used key and a fresh one.
func (r *run) statusEndpoint(ctx context.Context) error {
	const what = "the status endpoint: a used key, then a never-used one"
	c := r.p.cfg
	if c.StatusURL == "" {
		r.n++
		r.add(Finding{Step: StepStatus, Outcome: NotRequested, Grade: GradeSkipped,
			Summary: "Not run: no status endpoint given (Config.StatusURL; idem probe --status-url)."})
		return nil
	}
	if r.usedKey == "" {
		r.n++
		r.skip(StepStatus, "Not run: no key was completed to ask about.")
		return nil
	}
	if !r.afford(StepStatus, what, 2) {
		return nil
	}
	r.announce(StepStatus, 2, what, false)
	fresh := newKey()
	at := func(key string) target {
		return target{http.MethodGet, strings.ReplaceAll(c.StatusURL, "{key}", url.PathEscape(key))}
	}
	used := r.p.send(ctx, at(r.usedKey), r.form, r.usedKey, nil, "")
	never := r.p.send(ctx, at(fresh), r.form, fresh, nil, "")
	fd := Finding{Step: StepStatus, Requests: 2, Exchanges: exchanges(used, never)}
	var problems []string
	usedSt, _, usedErr := wire.DecodeStatus(used.Status, used.body, r.usedKey)
	switch {
	case used.Error != "":
		problems = append(problems, "the used key got no answer: "+used.Error)
	case usedErr != nil:
		problems = append(problems, fmt.Sprintf("the used key's answer (HTTP %d) is not in idem's status format: %v", used.Status, usedErr))
	case usedSt.State != wire.StateCompleted && usedSt.State != wire.StateProcessing:
		problems = append(problems, fmt.Sprintf("the used key reads %q", usedSt.State))
	}
	neverSt, _, neverErr := wire.DecodeStatus(never.Status, never.body, fresh)
	switch {
	case never.Error != "":
		problems = append(problems, "the never-used key got no answer: "+never.Error)
	case never.Status != http.StatusNotFound:
		problems = append(problems, fmt.Sprintf("a never-used key got HTTP %d, not 404", never.Status))
	case neverErr != nil || neverSt.State != wire.StateNotFound:
		problems = append(problems, "a never-used key got 404, but not idem's {\"state\":\"not_found\"}")
	}
	if len(problems) == 0 {
		fd.Outcome, fd.Grade = "idem-format", GradeOK
		fd.Summary = fmt.Sprintf("The used key reads %q, a never-used one 404 not_found, in idem's status format.", usedSt.State)
		if base, ok := strings.CutSuffix(c.StatusURL, "/{key}"); ok {
			r.status = fmt.Sprintf("idem.StatusEndpoint(%q)", base)
		} else {
			r.status = fmt.Sprintf("idem.StatusAdapter{Name: \"status\", URL: %q, Decode: …}", c.StatusURL)
			r.notes = append(r.notes, "The status endpoint answers in idem's format, but its URL does not end in /{key}: describe it with an idem.StatusAdapter.")
		}
	} else {
		fd.Outcome, fd.Grade = "other-format", GradeChange
		fd.Summary = "Not usable as idem.StatusEndpoint: " + strings.Join(problems, "; ") + ". Describe it with an idem.StatusAdapter whose Decode answers not found only when the server says so explicitly."
		if r.replayWorks {
			fd.Summary += " idem.ReplayStatus() works meanwhile."
		}
		r.notes = append(r.notes, "Status endpoint: "+strings.Join(problems, "; ")+".")
	}
	r.add(fd)
	return nil
}

// keyForm checks the key as a bare token and as an sf-string.
func (r *run) keyForm(ctx context.Context) error {
	const what = "the key as an sf-string, twice"
	f := r.form
	if f.quoted {
		r.n++
		r.add(Finding{Step: StepKeyForm, Outcome: "sf-string-only", Grade: GradeChange,
			Summary: fmt.Sprintf("The key is honoured as an sf-string; it was refused in %s: set QuoteKey.", strings.Join(r.refused, ", "))})
		return nil
	}
	if !r.afford(StepKeyForm, what, 2) {
		return nil
	}
	q := form{f.header, true}
	r.announce(StepKeyForm, 2, "the same key twice, in "+q.String(), false)
	key := newKey()
	first := r.p.send(ctx, r.main, q, key, r.p.cfg.Body, "body")
	sent := []answer{first}
	fd := Finding{Step: StepKeyForm}
	switch {
	case !first.ok():
		fd.Outcome, fd.Grade = "bare-only", GradeOK
		fd.Summary = fmt.Sprintf("The bare token is honoured; an sf-string was refused (%s%s). Keep QuoteKey false, the default.", statusText(first.Exchange), problemNote(first))
	default:
		second := r.p.send(ctx, r.main, q, key, r.p.cfg.Body, "body")
		sent = append(sent, second)
		if second.replayed() || second.sameAs(first) {
			fd.Outcome, fd.Grade = "both", GradeOK
			fd.Summary = "Both forms are honoured: the bare token (replay step) and the sf-string (replayed here). idem sends bare keys unless QuoteKey is set."
		} else {
			fd.Outcome, fd.Grade = "sf-string-ignored", GradeWarn
			fd.Summary = fmt.Sprintf("The sf-string is accepted but not honoured (%s, then %s, not a replay). Keep QuoteKey false, the default.", statusText(first.Exchange), statusText(second.Exchange))
		}
	}
	fd.Requests, fd.Exchanges = len(sent), exchanges(sent...)
	r.add(fd)
	return nil
}

// advice is what to set in idem.Config.
func (r *run) advice() Advice {
	var a Advice
	if r.honoured {
		if r.form.header != wire.KeyHeader {
			a.KeyHeader = r.form.header
		}
		a.QuoteKey = r.form.quoted
		switch {
		case r.status != "":
			a.Status = r.status
		case r.replayWorks:
			a.Status = "idem.ReplayStatus()"
		default:
			r.notes = append(r.notes, "Neither a status endpoint nor a replay settles an unknown outcome: give a status endpoint (Config.StatusURL) or an idem.StatusAdapter.")
		}
	}
	a.Notes = r.notes
	return a
}
