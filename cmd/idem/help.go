package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// helpCommand is "idem help [COMMAND]".
func helpCommand(e *env, args []string) error {
	switch len(args) {
	case 0:
		printUsage(e.stdout)
		for _, c := range commands {
			fmt.Fprintln(e.stdout)
			printCommandUsage(e.stdout, c)
		}
		return nil
	case 1:
		if args[0] == "help" {
			printUsage(e.stdout)
			return nil
		}
		c := lookupCommand(args[0])
		if c == nil {
			return usagef("help: unknown command %q (see 'idem help')", args[0])
		}
		printCommandUsage(e.stdout, c)
		return nil
	default:
		return usagef("help: unexpected argument %q (see 'idem help')", args[1])
	}
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, `Usage: idem [--journal PATH|URL] [--schema NAME] [--password-env NAME] COMMAND [flags] [arguments]

idem inspects and operates an idem journal, the SQLite file or the
PostgreSQL schema in which the idem SDK records every operation before
sending it. The journal is --journal (before or after the command), else
$IDEM_JOURNAL, else ./idem.db: a file's path, or a URL such as
postgres://idem@db.internal:5432/app whose journal is in schema --schema
(default idem), the password from $PGPASSWORD, ~/.pgpass or the variable
--password-env names. It is never created, and the commands that only
read never write. "idem probe" uses none: it checks what an API does with
idempotency keys.

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `  help       print the usage of every command, or of one

Run 'idem help COMMAND' for one command's flags.

Exit status: 0 success; 1 error (missing or foreign journal, unknown
operation, illegal state change, ...); 2 usage error (unknown command or
flag, missing argument, bad state name or duration, probe without
--yes, ui on a non-loopback address without a token); 3 resume left
operations unsettled; 4 probe: usable with changes; 5 probe: not safe.
Errors are one line on stderr, prefixed "idem: ".
`)
}

func printCommandUsage(w io.Writer, c *command) {
	fmt.Fprintf(w, "Usage: idem %s %s\n\n%s\n", c.name, c.args, strings.TrimSpace(c.help))
	fs := newFlagSet("idem " + c.name)
	var g globalFlags
	g.define(fs)
	c.setup(fs)
	fmt.Fprintln(w, "\nFlags:")
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		fmt.Fprintln(w, line)
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(w, "        %s\n", usage)
	})
}
