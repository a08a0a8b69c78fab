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
	"strings"

	"github.com/idemkit/idem"
)

var resumeCommand = &command{
	name:    "resume",
	args:    "--base-url URL (--status-url URL | --replay) [--header-env NAME=ENV ...] [--concurrency N] [--timeout D]",
	summary: "drive every due unfinished operation to a definitive answer",
	help: `
Drives every due pending, in_flight and unknown operation to a definitive
answer, as the application would after a restart. An operation whose
outcome is unknown gets a status check (GET URL/KEY on --status-url, or a
replay of the same key with --replay, for servers that replay stored
answers) before anything is re-sent, and every send reuses the journaled
key. Operations that another live process is driving are left to it.

--base-url names the API. Requests to any origin other than those of
--base-url and --status-url are refused and stay journaled, so that
credentials never go elsewhere.

Each --header-env NAME=ENV sets header NAME, on every request and status
check, to the value of the environment variable ENV, read at each request.
Credentials come only from the environment, never from the command line
(which shell history and ps keep) nor from the journal (which never holds
them). An unset or empty ENV is an error before anything is done.

On a terminal a progress line is updated in place. A summary is always
printed: claimed, succeeded, rejected, pending, unknown, expired, skipped,
failed. Exit status 0 when every operation taken up settled; 3 when some
remain (pending, unknown, expired, failed: they stay journaled for the
next run or an operator), or when --timeout or a signal stopped the run;
1 on error.`,
	setup: func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		var (
			baseURL, statusURL string
			replay             bool
			headers            headerEnvList
			concurrency        int
			timeout            ageFlag
		)
		fs.StringVar(&baseURL, "base-url", "", "the API's base `URL` (required)")
		fs.StringVar(&statusURL, "status-url", "", "the status endpoint's base `URL`: GET URL/KEY (this or --replay is required)")
		fs.BoolVar(&replay, "replay", false, "check status by re-sending the same key, for servers that replay stored answers")
		fs.Var(&headers, "header-env", "`NAME=ENV`: set header NAME to the value of environment variable ENV; may be repeated")
		fs.IntVar(&concurrency, "concurrency", 8, "drive at most `N` operations at once")
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
			if concurrency < 1 {
				return usagef("resume: --concurrency must be at least 1, not %d", concurrency)
			}
			for _, h := range headers {
				if e.getenv(h.env) == "" {
					return fmt.Errorf("resume: --header-env %s=%s: environment variable %s is unset or empty; export it first (credentials are read only from the environment)", h.header, h.env, h.env)
				}
			}
			r := &resumer{e: e, allowed: allowed, headers: headers}
			host, _ := os.Hostname()
			cfg := idem.Config{
				// The journal's history names who took each operation up.
				Owner:             fmt.Sprintf("idem-resume/%s/%d", host, os.Getpid()),
				BaseURL:           baseURL,
				Status:            checker,
				Authorize:         r.authorize,
				ResumeConcurrency: concurrency,
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
			return withJournal(e, func(j *idem.SQLiteJournal) error {
				cfg.Journal = j
				return r.run(ctx, j, cfg)
			})
		}
	},
}

type resumer struct {
	e        *env
	allowed  map[string]bool // origins requests may go to
	headers  headerEnvList
	progress *progressLine
}

// authorize is Config.Authorize: it refuses other origins and sets each
// --header-env header from the environment, as it is now.
func (r *resumer) authorize(req *http.Request) error {
	if o := origin(req.URL); !r.allowed[o] {
		return fmt.Errorf("refusing to send to %s: not the origin of --base-url or --status-url", o)
	}
	for _, h := range r.headers {
		v := r.e.getenv(h.env)
		if v == "" {
			return fmt.Errorf("environment variable %s, for header %s, is unset or empty", h.env, h.header)
		}
		req.Header.Set(h.header, v)
	}
	return nil
}

func (r *resumer) run(ctx context.Context, j *idem.SQLiteJournal, cfg idem.Config) error {
	e := r.e
	if n, example, err := r.elsewhere(ctx, j); err != nil {
		return err
	} else if n > 0 {
		fmt.Fprintf(e.stderr, "idem: warning: %d unsettled operation(s) target other origins than --base-url, such as %s; they are not sent and stay journaled\n", n, example)
	}
	c, err := idem.New(cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	rep, err := c.Resume(ctx)
	r.progress.clear()
	fmt.Fprintf(e.stdout, "resume: claimed %d, succeeded %d, rejected %d, pending %d, unknown %d, expired %d, skipped %d, failed %d\n",
		rep.Claimed, rep.Succeeded, rep.Rejected, rep.Pending, rep.Unknown, rep.Expired, rep.Skipped(), rep.Failed)
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

// elsewhere counts the active operations whose URL is at an origin that
// requests may not go to, and gives one such origin.
func (r *resumer) elsewhere(ctx context.Context, j idem.Journal) (int, string, error) {
	n, example := 0, ""
	f := idem.Filter{States: []idem.State{idem.StatePending, idem.StateInFlight, idem.StateUnknown}}
	for rec, err := range j.List(ctx, f) {
		if err != nil {
			return 0, "", err
		}
		u, err := url.Parse(rec.URL)
		if err != nil || !r.allowed[origin(u)] {
			n++
			if example == "" && err == nil {
				example = origin(u)
			}
		}
	}
	return n, example, nil
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
