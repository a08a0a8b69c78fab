package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/idemkit/idem/internal/webui"
)

var uiCommand = &command{
	name:    "ui",
	args:    "[--listen ADDR] [--allow-writes] [--token-env NAME]",
	summary: "serve a web view of the journal, live while the application runs",
	help: `
Serves a web view of the journal and prints its URL: the number of
operations by state and scope with the oldest unsettled one; a list that
filters by state, scope, age and text in the operation ID, paged through
the journal; and each operation's page, with its request and response
(credential headers hidden, bodies shown as text when they are, else as a
hex dump, both cut short when long) and a timeline of its attempts, waits
and status checks. Pages update every 2 seconds while the application
writes the journal. Ctrl-C stops it.

It is read-only unless --allow-writes: then an unknown or expired
operation can be reconciled (as succeeded or rejected, with a note), and
a pending one canceled, from its page, with the rules of "idem
reconcile" and "idem cancel".

--listen defaults to 127.0.0.1 on a free port, and without a token the
view answers only requests to a loopback name. Any other address (such as
0.0.0.0:8080) needs a token: --token-env NAME reads it from environment
variable NAME (never the command line, which ps and shell history keep),
and every request must then carry it, as "Authorization: Bearer TOKEN" or
through the log-in form. The token is never printed. The view speaks
plain HTTP: beyond a trusted network, put it behind a TLS proxy.`,
	setup: func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		var listen, tokenEnv string
		var allowWrites bool
		fs.StringVar(&listen, "listen", "127.0.0.1:0", "serve on `ADDR`, host:port; port 0 picks a free one; a non-loopback host needs --token-env")
		fs.BoolVar(&allowWrites, "allow-writes", false, "allow reconciling and canceling operations from the pages")
		fs.StringVar(&tokenEnv, "token-env", "", "require the token held by environment variable `NAME` of every request")
		return func(ctx context.Context, e *env, args []string) error {
			if err := wantArgs("ui", args); err != nil {
				return err
			}
			host, _, err := net.SplitHostPort(listen)
			if err != nil {
				return usagef("ui: --listen %q: want host:port, such as 127.0.0.1:8080 (%v)", listen, err)
			}
			if !isLoopback(host) && tokenEnv == "" {
				return usagef("ui: --listen %s is not a loopback address: the journal would be open to the network; "+
					"give a token with --token-env NAME (the token in environment variable NAME), or listen on 127.0.0.1", listen)
			}
			token := ""
			if tokenEnv != "" {
				if token = e.getenv(tokenEnv); strings.TrimSpace(token) == "" {
					return fmt.Errorf("ui: --token-env %s: environment variable %s is unset or empty; set it to the token the view requires", tokenEnv, tokenEnv)
				}
			}
			a := reading
			if allowWrites {
				a = writing
			}
			return withJournal(ctx, e, a, func(j *openJournal) error {
				path := ""
				if j.sqlite != nil {
					path = j.sqlite.Path()
				}
				h, err := webui.New(webui.Config{Journal: j.Journal, Path: path, AllowWrites: allowWrites, Token: token, Now: e.now,
					Alive: j.alive})
				if err != nil {
					return err
				}
				return serveUI(ctx, e, listen, h, allowWrites, token != "")
			})
		}
	},
}

// serveUI serves h on addr until ctx ends (Ctrl-C, SIGTERM), then lets
// the requests in progress finish.
func serveUI(ctx context.Context, e *env, addr string, h http.Handler, allowWrites, withToken bool) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("ui: listening on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()

	mode := "read-only"
	if allowWrites {
		mode = "writes allowed"
	}
	guard := "loopback only"
	if withToken {
		guard = "token required"
	}
	fmt.Fprintf(e.stdout, "idem ui: serving journal %s on http://%s/ (%s, %s); Ctrl-C stops it\n",
		clean(e.journalName()), l.Addr(), mode, guard)

	select {
	case err := <-served:
		return fmt.Errorf("ui: serving: %w", err)
	case <-ctx.Done():
	}
	stop, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(stop); err != nil {
		return fmt.Errorf("ui: stopping: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("ui: serving: %w", err)
	}
	return nil
}

// isLoopback reports whether a --listen host is this machine's loopback
// interface only: localhost, or a loopback IP. An empty host is every
// interface.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
