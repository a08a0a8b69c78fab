package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/operator"
	"github.com/idemkit/idem/internal/wire"
)

// newFlagSet returns a flag set that reports errors to its caller only:
// the caller prints them as one line.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseInterspersed parses flags that may come before, between or after
// the positional arguments, which it returns. "--" ends the flags.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// wantArgs checks the number of positional arguments.
func wantArgs(cmd string, args []string, names ...string) error {
	switch {
	case len(args) < len(names):
		return usagef("%s: missing %s (see 'idem help %s')", cmd, names[len(args)], cmd)
	case len(args) > len(names):
		return usagef("%s: unexpected argument %q (see 'idem help %s')", cmd, args[len(names)], cmd)
	}
	return nil
}

// stateList is a flag of comma-separated states that may be repeated.
type stateList []idem.State

func (s *stateList) String() string {
	names := make([]string, len(*s))
	for i, st := range *s {
		names[i] = st.String()
	}
	return strings.Join(names, ",")
}

func (s *stateList) Set(v string) error {
	for name := range strings.SplitSeq(v, ",") {
		if strings.TrimSpace(name) == "" {
			return errors.New("empty state name")
		}
		st, err := idem.ParseState(name)
		if err != nil {
			return errors.New(strings.TrimPrefix(err.Error(), "idem: "))
		}
		*s = append(*s, st)
	}
	return nil
}

// nameFlag is a name that filters, such as --owner or --scope: empty,
// it would filter nothing and list everything, which an unset shell
// variable asked for rather than the operator.
type nameFlag struct {
	value string
	what  string // what to give instead, for the message
}

func (n *nameFlag) String() string {
	if n == nil {
		return ""
	}
	return n.value
}

func (n *nameFlag) Set(v string) error {
	if v == "" {
		return fmt.Errorf("is empty; name %s, or leave the flag out to list every one", n.what)
	}
	if !printable(v) {
		// No name is such text: a PostgreSQL journal would refuse the
		// query with its encoding error, an SQLite one list nothing.
		return fmt.Errorf("is not printable text; name %s", n.what)
	}
	n.value = v
	return nil
}

// printable reports whether v is UTF-8 text without control characters,
// as every name a journal holds is.
func printable(v string) bool {
	return utf8.ValidString(v) && !strings.ContainsFunc(v, unicode.IsControl)
}

// ageFlag is a non-negative duration: a Go duration such as 90m or 36h, or
// days such as 7d or 1d12h.
type ageFlag struct {
	d   time.Duration
	set bool
}

func (a *ageFlag) String() string {
	if !a.set {
		return ""
	}
	return a.d.String()
}

func (a *ageFlag) Set(v string) error {
	d, err := operator.ParseAge(v)
	if err != nil {
		return err
	}
	a.d, a.set = d, true
	return nil
}

// headerEnv is one --header-env NAME=ENV: header NAME takes the value of
// environment variable ENV.
type headerEnv struct {
	header string // canonical
	env    string
}

type headerEnvList []headerEnv

func (l *headerEnvList) String() string {
	parts := make([]string, len(*l))
	for i, h := range *l {
		parts[i] = h.header + "=" + h.env
	}
	return strings.Join(parts, ",")
}

func (l *headerEnvList) Set(v string) error {
	name, envName, ok := strings.Cut(v, "=")
	if !ok || name == "" || envName == "" {
		return fmt.Errorf("want NAME=ENV, the header and the environment variable that holds its value, not %q", v)
	}
	if !wire.IsToken(name) {
		return fmt.Errorf("%q is not a valid header name", name)
	}
	if strings.ContainsAny(envName, "= \t") {
		return fmt.Errorf("%q is not an environment variable name", envName)
	}
	canon := http.CanonicalHeaderKey(name)
	if canon == "Idempotency-Key" {
		return fmt.Errorf("%s is the idempotency key, which idem sets itself (from the journal, or a fresh one when probing), never from the environment", canon)
	}
	for _, h := range *l {
		if h.header == canon {
			return fmt.Errorf("header %s is given twice", canon)
		}
	}
	*l = append(*l, headerEnv{header: canon, env: envName})
	return nil
}

// scopeList is --scope, which may be repeated.
type scopeList []string

func (s *scopeList) String() string { return strings.Join(*s, ",") }

func (s *scopeList) Set(v string) error {
	switch {
	case v == "":
		return errors.New("empty scope name")
	case len(v) > maxScopeLength:
		return fmt.Errorf("scope name of %d bytes, the limit is %d", len(v), maxScopeLength)
	case !printable(v):
		return fmt.Errorf("scope name %q is not printable text", v)
	case slices.Contains(*s, v):
		return fmt.Errorf("scope %q is given twice", v)
	}
	*s = append(*s, v)
	return nil
}

// maxScopeLength is the journal's limit on a scope name.
const maxScopeLength = 256
