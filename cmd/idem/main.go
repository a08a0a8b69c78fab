// Command idem is the operator's tool for an idem journal: the local SQLite
// file, or the PostgreSQL schema a fleet shares, in which the idem SDK records every state-changing HTTP operation
// (its idempotency key, the exact request, its state and history) before
// sending it. It lists and inspects operations (also in a web view, "idem
// ui"), resumes the unfinished ones, records an operator's decision about
// those whose outcome could not be confirmed, withdraws pending ones, and
// prunes settled ones. It also
// probes an API, before idem is trusted with it, for what it does with
// idempotency keys.
//
// It is a module of its own, which requires the root module and the
// postgres module (so that a program importing only the root module never
// downloads a PostgreSQL driver); its go.mod builds it against the
// repository it sits in, so install it from a clone:
//
//	git clone https://github.com/idemkit/idem && cd idem/cmd/idem && go install .
//
// # Usage
//
//	idem [--journal PATH|URL] [--schema NAME] [--password-env NAME] COMMAND [flags] [arguments]
//
// The journal is --journal (given before or after the command), else
// $IDEM_JOURNAL, else ./idem.db: an SQLite file's path, or a PostgreSQL
// URL such as postgres://idem@db.internal:5432/app, whose journal is in
// schema --schema (default idem). A PostgreSQL password comes from the URL,
// $PGPASSWORD or ~/.pgpass (as pgx reads them), or the environment
// variable --password-env names; it appears in no message, and a URL is
// printed without it. A journal is never created: a missing file, an empty
// file, a directory, a file or schema that is not an idem journal, a
// server that does not answer is an error, and nothing is changed. It is
// safe to run any command while applications use the journal: readers
// never block them, and writes wait for their locks.
//
// The commands that only read (ls, show, stats, and ui without
// --allow-writes) never write: an SQLite journal is opened read-only, a
// PostgreSQL one with each statement in a transaction begun READ ONLY
// (which holds behind a transaction pooler, where a read-only session
// cannot be had), and a journal of an older schema
// is refused with the command that migrates it (idem migrate) instead of
// being migrated.
//
// Flags may come before or after the arguments; "--" ends the flags.
//
// # Commands
//
//	idem ls [--state S[,S...]] [--scope S] [--owner NAME] [--older-than D] [--json]
//
// Lists operations, oldest first: key, scope, operation ID, state,
// attempts, age and last error, in a table (long IDs and errors are
// shortened; "idem show" prints them whole) or, with --json, one JSON
// object per line (no bodies). --state takes one or more comma-separated
// states (pending, in_flight, unknown, succeeded, rejected, expired,
// canceled) and may be repeated; --scope keeps one scope; --older-than D
// keeps operations created more than D ago, D being a Go duration such as
// 90m or 36h, or a number of days such as 7d; --owner NAME keeps the
// operations whose lease that worker holds or held last. A state marked "*"
// (past_retention in JSON) is an in_flight or unknown operation past the
// server's retention: "idem resume" marks it expired without sending.
//
//	idem show KEY|SCOPE/ID [--body] [--json]
//
// Prints one operation: every field of its record, the key's wire form
// (header name and value, quoted or bare; "not journaled (sent in the
// resuming client's form)" for a record of a schema-1 journal), the
// transport's own re-sends when there were any, the last error (such as
// a status check's cause), the server's stored response (status and
// headers) and its history as a timeline: one line per change with its
// version, time, kind (create, send, answer, status, claim, stop, expire,
// operator, update), state change ("=" when unchanged), attempt, status
// code, owner and why. An in_flight or unknown operation past the
// server's retention is flagged. The request and response bodies are
// printed only with --body: as text when they are UTF-8 text, else in
// base64 (which is said). The argument is first tried as a key; if no
// operation has that key and it contains "/", it is split at its first
// "/" into a scope and an operation ID, so that "default/checkout/cart-42"
// is operation "checkout/cart-42" of scope "default".
//
//	idem stats [--json]
//
// Prints the number of operations by state and by scope, the age of the
// oldest operation not yet settled (pending, in_flight, unknown or
// expired), the workers (each owner of a lease of an active operation, how
// many it holds and when its first lease ends; on PostgreSQL whether it is
// alive or gone, with the live workers that hold nothing), and the
// journal's size (the file and its -wal, or the schema's tables).
//
//	idem reconcile KEY|SCOPE/ID --as succeeded|rejected --note TEXT
//
// Records an operator's decision about an operation whose outcome could not
// be confirmed (unknown or expired), after checking the business records:
// nothing is sent. An in_flight operation left by a crashed process becomes
// unknown once "idem resume" has tried its status. The note
// says what the decision is based on and is required. An operation that a
// live process is driving is refused.
//
//	idem cancel KEY|SCOPE/ID
//
// Withdraws a pending operation that was never sent; it ends canceled and
// is never sent. An operation that may have reached the server cannot be
// canceled: reconcile it instead.
//
//	idem resume --base-url URL (--status-url URL | --replay) [--scope S ... | --all-scopes]
//	            [--header-env NAME=ENV ...] [--wait] [--concurrency N] [--timeout D]
//
// Drives every due pending, in_flight and unknown operation of the chosen
// scopes to a definitive answer, as the application would after a restart:
// operations whose outcome is unknown get a status check (GET URL/KEY on
// --status-url, or a replay of the same key with --replay) before anything
// is re-sent, and every send reuses the journaled key in its journaled
// form (header name, quoted or bare). Unknown or in_flight operations past
// the server's retention are marked expired without a request. Operations
// leased by a live process are left to it; those of a process that is gone
// are taken over at once.
//
// A scope is a tenant, and credentials belong to one: --scope S (repeatable;
// default "default") takes up the operations of those scopes only, and
// --all-scopes, for an operator whose credentials are good for every
// tenant, takes up every scope's; the two are exclusive. --base-url names
// the API: only operations whose URL has its origin are taken up (the
// others are left untouched, and counted in a warning), and requests to
// any other origin than --base-url and --status-url are refused, so that
// credentials never go elsewhere. Each --header-env NAME=ENV sets header
// NAME, on every request, to the value of environment variable ENV, read
// at each request: credentials come only from the environment, never from
// the command line (which shell history and ps keep) nor from the journal
// (which never holds them). An unset or empty ENV is an error before
// anything is done, and so is a header that carries an operation's key.
// --wait also waits for operations not due yet and for leases held by live
// processes, until every operation in scope is settled or expired, or
// --timeout or a signal stops it. --concurrency bounds the operations
// driven at once (default 8); --timeout bounds the whole run (default
// none). On a terminal a progress line is updated in place; a summary
// (claimed, succeeded, rejected, pending, unknown, expired, skipped,
// failed; then what was left alone and why: busy, leased by a live owner,
// not due with the next due time) is always printed, and a line counts
// the unsettled operations of other scopes, left alone. Interrupting it
// (Ctrl-C) stops it cleanly: every operation stays journaled.
//
//	idem migrate
//
// Migrates a journal written by an older idem to this build's schema, in
// place, and says from which version to which; a current one is left as
// it is. It never creates a journal.
//
//	idem prune --older-than D [--dry-run]
//
// Deletes settled operations (succeeded, rejected, canceled) last updated
// more than D ago, with their history, and prints how many. Expired
// operations wait for an operator and are kept. With --dry-run it only
// counts them.
//
//	idem ui [--listen ADDR] [--allow-writes] [--token-env NAME]
//
// Serves a web view of the journal and prints its URL: the number of
// operations by state and by scope with the oldest unsettled one; a list
// filtered by state, scope, age (older than D) and text in the operation
// ID, paged through the journal 100 at a time without loading it; and
// each operation's page, with its request and response (credential
// headers hidden; bodies as text when they are UTF-8 text, else as a hex
// dump, both cut short when long) and a timeline of its attempts, waits
// and status checks drawn from its history. The pages update every 2
// seconds while the application writes the journal. It is read-only
// unless --allow-writes: then an unknown or expired operation can be
// reconciled (as succeeded or rejected, with a note) and a pending one
// canceled from its page, with the rules and errors of reconcile and
// cancel; every such form carries a per-process CSRF token. --listen
// defaults to 127.0.0.1 on a free port; without a token the view answers
// only requests addressed to a loopback name. Any other address needs a
// token: --token-env NAME reads it from environment variable NAME, and
// every request must then carry it (Authorization: Bearer TOKEN, or the
// log-in form's session cookie); the token is never printed. A
// non-loopback --listen without --token-env is a usage error. Ctrl-C
// stops it.
//
//	idem probe --url URL [--method M] [--body JSON | --body-file F] [--other-body B]
//	           [--header-env NAME=ENV ...] [--key-header NAME] [--status-url TEMPLATE]
//	           [--other-url URL] [--other-method M] [--max-requests N] [--json] --yes
//
// Finds out what the endpoint --url names does with idempotency keys,
// with real requests (it needs no journal): the same key twice (replayed,
// with which replay header, or executed twice, in which case the other
// header names, Idempotency-Key and X-Idempotency-Key, are tried; a first
// request refused with 400, 422 or 428 is tried again with the key as an
// sf-string and in the other header); the same key with another body
// (--other-body, else the JSON body with its first number incremented);
// two requests with one key at once (409, a wait, or two executions); with
// --other-url or --other-method, a used key on that endpoint; with
// --status-url, a template such as https://api.example.com/idempotency/{key},
// the status of a used key and of a never-used one (404 expected), read in
// idem's status format; and the key as a bare token and as an sf-string.
// The requests may have real effects, so nothing is sent without --yes,
// at most --max-requests are sent (default 20; a step that does not fit is
// skipped, and the report says so), and each step prints how many it
// sends before it runs. Credentials come from --header-env, as for
// resume, and are never printed: the report names headers, never their
// values. The report is a table (each finding with its evidence: status
// codes, header names, timings; a verdict; the idem.Config fields to set)
// or, with --json, one JSON object, the steps then announced on stderr.
// Package github.com/idemkit/idem/probe runs the same checks from Go.
//
//	idem help [COMMAND]
//
// Prints the usage of every command, or of one; so does -h.
//
// # Exit status
//
//	0  success
//	1  error: a missing, empty or foreign journal file, a directory, an
//	   unknown operation, an illegal state change, an unset environment
//	   variable, a journal or network failure
//	2  usage error: an unknown command or flag, a missing argument or
//	   required flag (probe's --yes included), a bad state name, duration
//	   or URL, a non-loopback ui --listen without --token-env
//	3  resume finished, but operations remain unsettled (pending, unknown,
//	   expired or failed), or it was stopped by --timeout or a signal
//	4  probe: the API is usable with idem configured as the report says
//	   (another KeyHeader, QuoteKey, a status adapter)
//	5  probe: the API is not safe: a key ran twice, or keys are ignored
//
// probe exits 0 when the API is safe to use with idem, 1 when its first
// request was refused (the message says what to fix: the body, the
// credentials, the URL), and 2 without --yes.
//
// Every error is one line on stderr, prefixed "idem: ", and changes nothing
// in the journal.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

// Exit statuses.
const (
	exitOK        = 0
	exitError     = 1
	exitUsage     = 2
	exitUnsettled = 3
	exitUsable    = 4
	exitNotSafe   = 5
)

// env is what a command runs with.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	// journal is the journal: a file's path or a PostgreSQL URL, resolved
	// from --journal, $IDEM_JOURNAL or the default. journalName() is how
	// messages name it, without a password.
	journal string
	// schemaName is --schema (schemaSet when given) and passwordEnv is
	// --password-env, for a PostgreSQL journal.
	schemaName  string
	schemaSet   bool
	passwordEnv string
	now         func() time.Time
}

// A command is one subcommand. setup defines its flags on fs and returns
// the function that runs it with its positional arguments.
type command struct {
	name    string
	args    string // synopsis of flags and arguments
	summary string // one line
	help    string // what it does, wrapped at 72 columns
	setup   func(fs *flag.FlagSet) func(ctx context.Context, e *env, args []string) error
}

// commands lists the subcommands in the order help shows them.
var commands = []*command{lsCommand, showCommand, statsCommand, reconcileCommand, cancelCommand,
	resumeCommand, pruneCommand, migrateCommand, uiCommand, probeCommand}

func lookupCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// run is the whole program, minus the process: it returns the exit status.
func run(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	e := &env{stdout: stdout, stderr: stderr, getenv: getenv, now: time.Now}
	err := dispatch(ctx, e, args)
	// A PostgreSQL error may quote the connection string: no password
	// leaves in a message.
	return report(scrub(err, e.secrets()), stderr)
}

// usageError is an error in the command line itself: exit status 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// exitStatus ends the program with a status and no message of its own.
type exitStatus int

func (s exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(s)) }

// report prints err as one line on stderr and returns the exit status.
func report(err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	var st exitStatus
	if errors.As(err, &st) {
		return int(st)
	}
	code := exitError
	var ue usageError
	if errors.As(err, &ue) {
		code = exitUsage
	}
	fmt.Fprintln(stderr, "idem: "+oneLine(err.Error()))
	return code
}

var lineBreaks = strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ")

// oneLine makes an error message fit on one line without a second "idem"
// prefix: the root package's errors start with "idem: " or "idem journal".
func oneLine(msg string) string {
	msg = strings.TrimPrefix(msg, "idem: ")
	if strings.HasPrefix(msg, "idem journal ") {
		msg = strings.TrimPrefix(msg, "idem ")
	}
	// A message may quote what the journal holds (an ID, an owner), which
	// whoever wrote it chose: no control character reaches the terminal.
	return strings.Map(func(r rune) rune {
		if r == '\t' {
			return ' '
		}
		if unicode.IsControl(r) || r == utf8.RuneError {
			return '?'
		}
		return r
	}, strings.TrimSpace(lineBreaks.Replace(msg)))
}

func dispatch(ctx context.Context, e *env, args []string) error {
	var g globalFlags
	global := newFlagSet("idem")
	g.define(global)
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(e.stdout)
			return nil
		}
		return usagef("%v (see 'idem help')", err)
	}
	rest := global.Args()
	if len(rest) == 0 {
		return usagef("no command given (see 'idem help')")
	}
	name, rest := rest[0], rest[1:]
	if name == "help" {
		return helpCommand(e, rest)
	}
	cmd := lookupCommand(name)
	if cmd == nil {
		return usagef("unknown command %q (see 'idem help')", name)
	}
	fs := newFlagSet("idem " + name)
	g.define(fs)
	runCmd := cmd.setup(fs)
	pos, err := parseInterspersed(fs, rest)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printCommandUsage(e.stdout, cmd)
			return nil
		}
		return usagef("%s: %v (see 'idem help %s')", name, err, name)
	}
	e.journal = g.journal.path(e.getenv)
	e.schemaName, e.schemaSet = g.schema.value, g.schema.set
	e.passwordEnv = g.passwordEnv.value
	if e.schemaSet && e.schemaName == "" {
		return usagef("--schema is empty; name a schema, such as %q", defaultSchema)
	}
	if e.schemaSet && !printable(e.schemaName) {
		return usagef("--schema %q is not printable text; name a schema, such as %q", e.schemaName, defaultSchema)
	}
	if g.passwordEnv.set && e.passwordEnv == "" {
		return usagef("--password-env is empty; name the environment variable that holds the password, or leave the flag out")
	}
	return runCmd(ctx, e, pos)
}

const journalUsage = "the journal: a file's `PATH`, or a PostgreSQL URL postgres://USER@HOST:PORT/DATABASE (default $IDEM_JOURNAL, else ./idem.db)"

// globalFlags are the flags every command accepts, before or after its
// name.
type globalFlags struct {
	journal, schema, passwordEnv journalFlag
}

func (g *globalFlags) define(fs *flag.FlagSet) {
	fs.Var(&g.journal, "journal", journalUsage)
	fs.Var(&g.schema, "schema", "the `SCHEMA` of a PostgreSQL journal (default idem)")
	fs.Var(&g.passwordEnv, "password-env", "read a PostgreSQL journal's password from environment variable `NAME` "+
		"(else the URL, $PGPASSWORD or ~/.pgpass); never on the command line, which ps and shell history keep")
}

// journalFlag is a flag every command accepts too, so that it may come
// before or after the command: --journal, --schema, --password-env.
type journalFlag struct {
	value string
	set   bool
}

func (j *journalFlag) String() string { return j.value }

func (j *journalFlag) Set(v string) error {
	j.value, j.set = v, true
	return nil
}

func (j *journalFlag) path(getenv func(string) string) string {
	switch {
	case j.set:
		return j.value
	case getenv("IDEM_JOURNAL") != "":
		return getenv("IDEM_JOURNAL")
	default:
		return "idem.db"
	}
}
