package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/idemkit/idem/probe"
)

var probeCommand = &command{
	name: "probe",
	args: "--url URL [--method M] [--body JSON | --body-file F] [--other-body B] [--header-env NAME=ENV ...]\n" +
		"            [--key-header NAME] [--status-url URL] [--other-url URL] [--other-method M] [--max-requests N] [--json] --yes",
	summary: "find out what an API does with idempotency keys before trusting it",
	help: `
Runs a short sequence of requests against the endpoint --url names and
reports what it does with idempotency keys, with the evidence (status
codes, header names, timings), a verdict, and the idem.Config fields to
set. No journal is used.

The requests are real: they may create orders or charge cards. Probe a
test account or a staging API. Nothing is sent without --yes; at most
--max-requests requests are sent (default 20), and each step says how
many it sends before it runs. A step the budget cannot afford is skipped,
and the report says so. Each step uses a fresh random key.

The steps: (1) the same key twice: replayed (which replay header), or
executed twice, in which case the other header names are tried
(Idempotency-Key, X-Idempotency-Key); a first request refused with 400,
422 or 428 is tried again with the key as an sf-string and in the other
headers; (2) the same key with another body (--other-body, else the JSON
body with its first number incremented): refused, and as what, or
silently replayed; (3) two requests with one key at once: 409, a wait, or
two executions; (4) with --other-url or --other-method, a used key on
that endpoint: the same entry or a new one; (5) with --status-url (a
template with {key}, such as https://api.example.com/idempotency/{key}):
the status of a used key and of a never-used one (404 expected), in
idem's format; (6) the key as a bare token and as an sf-string.

The request body is --body (JSON, sent with Content-Type:
application/json) or --body-file. Each --header-env NAME=ENV sets header
NAME, on every request, to the value of environment variable ENV:
credentials come only from the environment, and the report names
headers, never their values. --key-header is the header to send the key
in first (default Idempotency-Key).

The report is a table, or with --json one JSON object. Exit status 0
when the API is safe to use with idem; 4 when it is usable with the
changes the report lists (KeyHeader, QuoteKey, a status adapter); 5 when
it is not safe (a key ran twice, or keys are ignored); 1 when the probe
could not run (the first request was refused: the message says what to
fix); 2 on a usage error, --yes missing included.`,
	setup: func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		var (
			cfg                        probe.Config
			body, bodyFile, other      string
			headers                    headerEnvList
			yes, asJSON                bool
			bodySet, otherSet, fileSet bool
		)
		fs.StringVar(&cfg.URL, "url", "", "the endpoint's `URL` (required)")
		fs.StringVar(&cfg.Method, "method", "POST", "the request's `METHOD`")
		fs.Func("body", "the request body, a valid request for the endpoint (`JSON`)", func(v string) error {
			body, bodySet = v, true
			return nil
		})
		fs.Func("body-file", "read the request body from `FILE`", func(v string) error {
			bodyFile, fileSet = v, true
			return nil
		})
		fs.Func("other-body", "the `BODY` sent under a used key in the mismatch step (default: the JSON body with its first number incremented)", func(v string) error {
			other, otherSet = v, true
			return nil
		})
		fs.Var(&headers, "header-env", "`NAME=ENV`: set header NAME to the value of environment variable ENV; may be repeated")
		fs.StringVar(&cfg.KeyHeader, "key-header", "Idempotency-Key", "the header `NAME` to send the key in first")
		fs.StringVar(&cfg.StatusURL, "status-url", "", "the status endpoint, with {key} where the key goes (`TEMPLATE`)")
		fs.StringVar(&cfg.OtherURL, "other-url", "", "another endpoint to send a used key to (`URL`)")
		fs.StringVar(&cfg.OtherMethod, "other-method", "", "another method to send a used key with (`METHOD`)")
		fs.IntVar(&cfg.MaxRequests, "max-requests", probe.DefaultMaxRequests, "send at most `N` requests")
		fs.BoolVar(&asJSON, "json", false, "print the report as one JSON object")
		fs.BoolVar(&yes, "yes", false, "send the requests, which may have real effects")
		return func(ctx context.Context, e *env, args []string) error {
			if err := wantArgs("probe", args); err != nil {
				return err
			}
			if cfg.URL == "" {
				return usagef("probe: --url is required")
			}
			for _, u := range []struct{ flag, v string }{{"--url", cfg.URL}, {"--other-url", cfg.OtherURL}, {"--status-url", strings.ReplaceAll(cfg.StatusURL, "{key}", "k")}} {
				if u.v == "" {
					continue
				}
				if _, err := parseAPIURL(u.flag, u.v); err != nil {
					return usagef("probe: %s", strings.TrimPrefix(err.Error(), "resume: "))
				}
			}
			if cfg.StatusURL != "" && strings.Count(cfg.StatusURL, "{key}") != 1 {
				return usagef("probe: --status-url %q must hold {key} once, where the key goes, such as https://api.example.com/idempotency/{key}", cfg.StatusURL)
			}
			if cfg.MaxRequests < 2 {
				return usagef("probe: --max-requests must be at least 2 (the first step sends 2), not %d", cfg.MaxRequests)
			}
			switch {
			case bodySet && fileSet:
				return usagef("probe: give --body or --body-file, not both")
			case bodySet:
				cfg.Body = []byte(body)
			case fileSet:
				b, err := os.ReadFile(bodyFile)
				if err != nil {
					return fmt.Errorf("probe: --body-file: %w", err)
				}
				cfg.Body = b
			}
			if otherSet {
				cfg.OtherBody = []byte(other)
			}
			if !yes {
				return usagef("probe: it sends up to %d real requests to %s %s, which may create orders or charge cards; probe a test account, and add --yes to run it",
					cfg.MaxRequests, strings.ToUpper(cfg.Method), cfg.URL)
			}
			cfg.Header = http.Header{}
			for _, h := range headers {
				v := e.getenv(h.env)
				if v == "" {
					return fmt.Errorf("probe: --header-env %s=%s: environment variable %s is unset or empty; export it first (credentials are read only from the environment)", h.header, h.env, h.env)
				}
				cfg.Header.Set(h.header, v)
			}
			progress := e.stdout
			if asJSON {
				progress = e.stderr
			}
			cfg.OnStep = func(s probe.Step) {
				fmt.Fprintf(progress, "step %d: sends %d %s (%s)\n", s.N, s.Requests, plural(s.Requests, "request"), clean(s.What))
			}
			rep, err := probe.Run(ctx, cfg)
			if err != nil {
				if errors.Is(err, probe.ErrInvalidConfig) {
					return usagef("probe: %s", strings.TrimPrefix(err.Error(), "probe: invalid config: "))
				}
				return err
			}
			if asJSON {
				if err := writeJSON(e.stdout, rep); err != nil {
					return err
				}
			} else {
				printProbeReport(e.stdout, rep)
			}
			switch rep.Verdict {
			case probe.Usable:
				return exitStatus(exitUsable)
			case probe.NotSafe:
				return exitStatus(exitNotSafe)
			}
			return nil
		}
	},
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// printProbeReport writes the report as a table, then each finding's
// summary, the verdict and the advice.
func printProbeReport(w io.Writer, rep probe.Report) {
	fmt.Fprintf(w, "\nprobe: %s %s: %d of at most %d requests sent\n\n", rep.Method, clean(rep.URL), rep.Requests, rep.MaxRequests)
	tw := newTable(w)
	row(tw, "STEP", "OUTCOME", "GRADE", "EVIDENCE")
	for _, f := range rep.Findings {
		var ev []string
		for _, x := range f.Exchanges {
			ev = append(ev, x.Brief())
		}
		row(tw, f.Step, f.Outcome, string(f.Grade), strings.Join(ev, "; "))
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, f := range rep.Findings {
		fmt.Fprintf(w, "%s: %s\n", f.Step, clean(f.Summary))
	}
	fmt.Fprintf(w, "\nverdict: %s\n", rep.Verdict.Describe())
	if !rep.Complete {
		fmt.Fprintln(w, "some steps were skipped (see above): the verdict covers the steps that ran")
	}
	if rep.Advice.Status != "" || rep.Advice.KeyHeader != "" || rep.Advice.QuoteKey {
		fmt.Fprintln(w, "\nset in idem.Config:")
		for line := range strings.Lines(rep.Advice.GoCode()) {
			fmt.Fprint(w, "    "+line)
		}
		fmt.Fprintln(w)
	}
	for _, n := range rep.Advice.Notes {
		fmt.Fprintln(w, "note: "+clean(n))
	}
}
