package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/operator"
	"github.com/idemkit/idem/internal/wire"
)

var resumeCommand = &command{
	name: "resume",
	args: "--base-url URL (--status-url URL | --replay) [--scope S ... | --all-scopes] [--header-env NAME=ENV ...]\n" +
		"            [--wait] [--concurrency N] [--timeout D] [--legacy-key-header NAME] [--legacy-quote-key]",
	summary: "drive every due unfinished operation of a scope to a definitive answer",
	help: `
Drives every due pending, in_flight and unknown operation of the chosen
scopes to a definitive answer, as the application would after a restart.
An operation whose outcome is unknown gets a status check (GET URL/KEY on
--status-url, or a replay of the same key with --replay, for servers that
replay stored answers) before anything is re-sent, and every send reuses
the journaled key in its journaled form (header name, quoted or bare),
whatever the application's configuration was. An unknown or in_flight
operation past the server's retention is marked expired without a
request. An operation leased by a live process is left to it; one leased
by a process that is gone is taken over at once.

Scopes are tenants: credentials belong to one. --scope S takes up the
operations of scope S only (the default is --scope default), and may be
repeated for credentials good for several. --all-scopes takes up every
scope's, for an operator whose credentials are good for every tenant.
Give one or the other, not both. Operations of other scopes are left
alone, and counted.

--base-url names the API: only operations whose URL has its origin are
taken up (the others are left untouched, and counted in a warning), and
requests to any origin other than those of --base-url and --status-url
are refused, so that credentials never go elsewhere.

Each --header-env NAME=ENV sets header NAME, on every request and status
check, to the value of the environment variable ENV, read at each request.
Credentials come only from the environment, never from the command line
(which shell history and ps keep) nor from the journal (which never holds
them). An unset or empty ENV is an error before anything is done, and so
is a header that carries the key of an operation to resume.

Operations journaled by idem before the key's form was journaled (a
journal of schema 1: 'idem show' says "not journaled") are sent with the
key in the header --legacy-key-header names (default Idempotency-Key),
quoted with --legacy-quote-key: give the form the application used then,
or a server that reads another header runs them again.

Without --wait, resume makes one pass over what is due. With --wait it
also waits for operations that are not due yet, and for leases held by
live processes to end, and goes on until every operation it may take up
is settled or expired, or --timeout or a signal stops it.

On a terminal a progress line is updated in place. A summary is always
printed: claimed, succeeded, rejected, pending, unknown, expired, skipped,
failed; then what was left alone and why: busy, leased by a live owner,
not due (with the next due time). Operations of other scopes, left
alone, are counted on a line of their own. Exit status 0 when every
operation taken up settled (operations left alone do not count); 3 when
some remain (pending, unknown, expired, failed: they stay journaled for
the next run or an operator), or when --timeout or a signal stopped the
run; 1 on error.`,
	setup: func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		var (
			baseURL, statusURL string
			replay, allScopes  bool
			wait, legacyQuoted bool
			legacyHeader       string
			scopes             scopeList
			headers            headerEnvList
			concurrency        int
			timeout            ageFlag
		)
		fs.StringVar(&baseURL, "base-url", "", "the API's base `URL` (required)")
		fs.StringVar(&statusURL, "status-url", "", "the status endpoint's base `URL`: GET URL/KEY (this or --replay is required)")
		fs.BoolVar(&replay, "replay", false, "check status by re-sending the same key, for servers that replay stored answers")
		fs.Var(&scopes, "scope", "take up the operations of `SCOPE` (a tenant, whose credentials --header-env gives); may be repeated (default: the scope named default)")
		fs.BoolVar(&allScopes, "all-scopes", false, "take up the operations of every scope, for an operator whose credentials are good for every tenant; not with --scope")
		fs.Var(&headers, "header-env", "`NAME=ENV`: set header NAME to the value of environment variable ENV; may be repeated")
		fs.BoolVar(&wait, "wait", false, "wait for operations not due yet and for leases held by live processes, until every one is settled or --timeout ends")
		fs.IntVar(&concurrency, "concurrency", 8, "drive at most `N` operations at once")
		fs.StringVar(&legacyHeader, "legacy-key-header", "", "the key's header `NAME` for operations whose form was not journaled (schema 1); default Idempotency-Key")
		fs.BoolVar(&legacyQuoted, "legacy-quote-key", false, "send the key of operations whose form was not journaled as a quoted sf-string")
		fs.Var(&timeout, "timeout", "stop after `D`, such as 10m; operations left stay journaled (default none)")
		return func(ctx context.Context, e *env, args []string) error {
			if err := wantArgs("resume", args); err != nil {
				return err
			}
			if baseURL == "" {
				return usagef("resume: --base-url is required")
			}
			allowed := map[string]bool{}
			base, err := parseAPIURL("--base-url", baseURL)
			if err != nil {
				return err
			}
			allowed[origin(base)] = true
			var checker idem.StatusChecker
			switch {
			case statusURL != "" && replay:
				return usagef("resume: give --status-url or --replay, not both")
			case statusURL != "":
				su, err := parseAPIURL("--status-url", statusURL)
				if err != nil {
					return err
				}
				allowed[origin(su)] = true
				checker = idem.StatusEndpoint(statusURL)
			case replay:
				checker = idem.ReplayStatus()
			default:
				return usagef("resume: --status-url URL or --replay is required, to check the status of operations whose outcome is unknown")
			}
			switch {
			case allScopes && len(scopes) > 0:
				return usagef("resume: give --scope or --all-scopes, not both")
			case len(scopes) == 0:
				scopes = scopeList{"default"}
			}
			if concurrency < 1 {
				return usagef("resume: --concurrency must be at least 1, not %d", concurrency)
			}
			if legacyHeader != "" && !wire.IsToken(legacyHeader) {
				return usagef("resume: --legacy-key-header %q is not a header name", legacyHeader)
			}
			for _, h := range headers {
				if e.getenv(h.env) == "" {
					return fmt.Errorf("resume: --header-env %s=%s: environment variable %s is unset or empty; export it first (credentials are read only from the environment)", h.header, h.env, h.env)
				}
			}
			r := &resumer{e: e, allowed: allowed, headers: headers, scopes: scopes, allScopes: allScopes}
			host, _ := os.Hostname()
			cfg := idem.Config{
				// The journal's history names who took each operation up.
				Owner:             fmt.Sprintf("idem-resume/%s/%d", host, os.Getpid()),
				BaseURL:           baseURL,
				Scope:             scopes[0],
				ResumeScopes:      scopes,
				Status:            checker,
				Authorize:         r.authorize,
				ResumeConcurrency: concurrency,
				// Only records whose form was not journaled use the
				// client's: every other record carries its own.
				KeyHeader: legacyHeader,
				QuoteKey:  legacyQuoted,
			}
			if allScopes {
				r.opts = append(r.opts, idem.ResumeAllScopes())
			}
			if wait {
				r.opts = append(r.opts, idem.ResumeWait())
			}
			if isTerminal(e.stdout) {
				r.progress = &progressLine{w: e.stdout}
				cfg.OnResumeProgress = r.progress.update
			}
			if timeout.set && timeout.d > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout.d)
				defer cancel()
			}
			return withJournal(ctx, e, writing, func(j *openJournal) error {
				cfg.Journal = j.Journal
				return r.run(ctx, j.Journal, cfg)
			})
		}
	},
}

type resumer struct {
	e         *env
	allowed   map[string]bool // origins requests may go to
	headers   headerEnvList
	scopes    scopeList // the scopes taken up, unless allScopes
	allScopes bool
	opts      []idem.ResumeOption
	progress  *progressLine
}

// authorize is Config.Authorize: it refuses other origins and sets each
// --header-env header from the environment, as it is now.
func (r *resumer) authorize(req *http.Request) error {
	if o := origin(req.URL); !r.allowed[o] {
		return fmt.Errorf("refusing to send to %s: not the origin of --base-url or --status-url", o)
	}
	info, _ := idem.OperationFrom(req.Context())
	for _, h := range r.headers {
		v := r.e.getenv(h.env)
		if v == "" {
			return fmt.Errorf("environment variable %s, for header %s, is unset or empty", h.env, h.header)
		}
		if info.Key != "" && strings.Contains(req.Header.Get(h.header), info.Key) {
			return fmt.Errorf("refusing to replace header %s, which carries the idempotency key, with --header-env %s", h.header, h.env)
		}
		req.Header.Set(h.header, v)
	}
	return nil
}

func (r *resumer) run(ctx context.Context, j idem.Journal, cfg idem.Config) error {
	e := r.e
	look, err := r.survey(ctx, j)
	if err != nil {
		return err
	}
	for _, h := range r.headers {
		if slices.Contains(look.keyHeaders, h.header) {
			return usagef("resume: --header-env %s=%s: %s carries the idempotency key of operations to resume, which comes from the journal, never from the environment", h.header, h.env, h.header)
		}
	}
	if look.elsewhere > 0 {
		fmt.Fprintf(e.stderr, "idem: warning: %d unsettled operation(s) target other origins than --base-url, such as %s; they are not sent and stay journaled\n", look.elsewhere, look.example)
	}
	c, err := idem.New(cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	rep, err := c.Resume(ctx, r.opts...)
	r.progress.clear()
	fmt.Fprintln(e.stdout, summaryLine(rep, e.now()))
	if look.otherScopes > 0 {
		fmt.Fprintf(e.stdout, "resume: left alone %d unsettled operation(s) of other scopes (%s); --scope or --all-scopes takes them up\n",
			look.otherScopes, look.scopeNames())
	}
	stopped := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
	if err != nil && !stopped {
		return err
	}
	if left, err := unsettled(context.WithoutCancel(ctx), j); err == nil && left > 0 {
		fmt.Fprintf(e.stdout, "journal: %d operation(s) unsettled (see 'idem ls --state pending,in_flight,unknown,expired')\n", left)
	}
	switch {
	case stopped:
		why := "--timeout"
		if errors.Is(err, context.Canceled) {
			why = "a signal"
		}
		fmt.Fprintf(e.stderr, "idem: resume stopped by %s before it finished; unsettled operations stay journaled for the next run\n", why)
		return exitStatus(exitUnsettled)
	case rep.Remaining() > 0:
		fmt.Fprintf(e.stderr, "idem: %d operation(s) remain unsettled (pending %d, unknown %d, expired %d, failed %d); they stay journaled\n",
			rep.Remaining(), rep.Pending, rep.Unknown, rep.Expired, rep.Failed)
		return exitStatus(exitUnsettled)
	}
	return nil
}

// summaryLine is the report of a run: what it took up and where each
// ended, then what it left alone in its scopes and why.
func summaryLine(rep idem.ResumeReport, now time.Time) string {
	line := fmt.Sprintf("resume: claimed %d, succeeded %d, rejected %d, pending %d, unknown %d, expired %d, skipped %d, failed %d;"+
		" left alone: busy %d, leased by a live owner %d, not due %d",
		rep.Claimed, rep.Succeeded, rep.Rejected, rep.Pending, rep.Unknown, rep.Expired, rep.Skipped(), rep.Failed,
		rep.Busy, rep.Leased, rep.NotDue)
	if rep.NotDue > 0 && !rep.NextDue.IsZero() {
		line += fmt.Sprintf(" (the next due at %s, in %s)", rep.NextDue.UTC().Format("2006-01-02 15:04:05.000Z07:00"),
			operator.FormatAge(rep.NextDue.Sub(now)))
	}
	return line
}

// look is what the journal holds that this run will not take up.
type look struct {
	// elsewhere counts the active operations of the scopes taken up whose
	// URL is at an origin requests may not go to; example is one.
	elsewhere int
	example   string
	// otherScopes counts the active operations of the other scopes.
	otherScopes int
	scopes      []string // their first few names
	// keyHeaders are the headers that carry the keys of the operations
	// taken up.
	keyHeaders []string
}

const lookMaxScopes = 3

func (l look) scopeNames() string {
	names := strings.Join(l.scopes, ", ")
	if l.otherScopes > len(l.scopes) && len(l.scopes) == lookMaxScopes {
		names += ", …"
	}
	return clean(names)
}

// survey counts the active operations this run leaves alone because of
// their scope or their origin.
func (r *resumer) survey(ctx context.Context, j idem.Journal) (look, error) {
	var l look
	f := idem.Filter{States: []idem.State{idem.StatePending, idem.StateInFlight, idem.StateUnknown}}
	for rec, err := range j.List(ctx, f) {
		if err != nil {
			return look{}, err
		}
		if !r.allScopes && !slices.Contains(r.scopes, rec.Scope) {
			l.otherScopes++
			if len(l.scopes) < lookMaxScopes && !slices.Contains(l.scopes, rec.Scope) {
				l.scopes = append(l.scopes, rec.Scope)
			}
			continue
		}
		u, err := url.Parse(rec.URL)
		if err != nil || !r.allowed[origin(u)] {
			l.elsewhere++
			if l.example == "" && err == nil {
				l.example = origin(u)
			}
			continue
		}
		if h := http.CanonicalHeaderKey(rec.KeyHeader); h != "" && !slices.Contains(l.keyHeaders, h) {
			l.keyHeaders = append(l.keyHeaders, h)
		}
	}
	return l, nil
}

// unsettled counts the journal's operations that are not settled.
func unsettled(ctx context.Context, j idem.Journal) (int, error) {
	counts, err := j.Count(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, c := range counts {
		if !c.State.Terminal() {
			n += c.N
		}
	}
	return n, nil
}

// parseAPIURL checks a URL flag: absolute http or https, with a host and
// without credentials.
func parseAPIURL(flagName, v string) (*url.URL, error) {
	u, err := url.Parse(v)
	switch {
	case err != nil:
		return nil, usagef("resume: %s %q does not parse: %v", flagName, v, err)
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "":
		return nil, usagef("resume: %s %q must be an absolute http or https URL", flagName, v)
	case u.User != nil:
		return nil, usagef("resume: %s must not carry credentials; pass them with --header-env", flagName)
	}
	return u, nil
}

// origin is scheme://host:port, with the default port made explicit.
func origin(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if port == "" {
		switch scheme {
		case "http":
			port = "80"
		case "https":
			port = "443"
		}
	}
	return scheme + "://" + strings.ToLower(u.Hostname()) + ":" + port
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progressLine is a line rewritten in place with "\r". Resume calls
// update from one goroutine at a time.
type progressLine struct {
	w    io.Writer
	last int // length of the line on screen
}

func (p *progressLine) update(r idem.ResumeReport) {
	done := r.Succeeded + r.Rejected + r.Remaining()
	line := fmt.Sprintf("resume: %d of %d claimed done: %d succeeded, %d rejected, %d pending, %d unknown, %d expired, %d failed",
		done, r.Claimed, r.Succeeded, r.Rejected, r.Pending, r.Unknown, r.Expired, r.Failed)
	p.write(line)
}

func (p *progressLine) write(line string) {
	pad := max(p.last-len(line), 0)
	fmt.Fprint(p.w, "\r"+line+strings.Repeat(" ", pad))
	p.last = len(line)
}

// clear erases the progress line, if any.
func (p *progressLine) clear() {
	if p == nil || p.last == 0 {
		return
	}
	fmt.Fprint(p.w, "\r"+strings.Repeat(" ", p.last)+"\r")
	p.last = 0
}
