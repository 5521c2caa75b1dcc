// Command outbox operates a txoutbox outbox from the shell: it migrates the tables, shows
// the backlog and the dead letters, replays or discards them one by one or by filter, prunes
// what is old, runs a standalone relay to any supported broker, and serves a small web
// console. It speaks PostgreSQL, MySQL/MariaDB and SQLite, and is configured by flags and
// the environment (OUTBOX_DATABASE_URL). Run "outbox help" for the commands, and see
// README.md beside this file for a session. It is for operators: the people who run an
// outbox, Go programmers or not.
//
// Exit codes: 0 success; 1 failure (the database or broker failed, or a bulk action
// stopped); 2 usage (an unknown command, a bad flag or value, a missing setting); 3 not
// found (a dead letter ID that does not exist); 4 refused by the entry (not pending any more,
// or cannot be replayed); 5 the schema is not current (migrate --check).
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

	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/internal/sqlstore"
)

// Exit codes, documented in the package comment and README.md.
const (
	exitOK       = 0
	exitFailure  = 1
	exitUsage    = 2
	exitNotFound = 3
	exitRefused  = 4
	exitSchema   = 5
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := newApp(os.Stdin, os.Stdout, os.Stderr, os.Getenv).run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

// app is one run of the command: its streams and environment, so tests run it in process.
type app struct {
	stdin  io.Reader
	stdout io.Writer
	// stderr redacts every secret the configuration named (see redactor).
	stderr *redactor
	getenv func(string) string
	// stdinTerminal and stderrTerminal say whether a person is there: a confirmation
	// prompt needs the first, a progress bar the second.
	stdinTerminal, stderrTerminal bool
}

func newApp(stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) *app {
	a := &app{
		stdin: stdin, stdout: stdout, stderr: &redactor{w: stderr}, getenv: getenv,
		stdinTerminal: isTerminal(stdin), stderrTerminal: isTerminal(stderr),
	}
	// The secrets the environment holds are known before anything can print them, whether
	// or not this run uses them.
	for _, name := range []string{"OUTBOX_DATABASE_URL", "OUTBOX_TRANSPORT_URL", "AZURE_STORAGE_CONNECTION_STRING"} {
		a.stderr.addAny(getenv(name))
	}
	for _, name := range []string{"OUTBOX_CONSOLE_TOKEN", "OUTBOX_CONSOLE_PASSWORD", "OUTBOX_RELAY_TOKEN", "OUTBOX_RELAY_PASSWORD"} {
		a.stderr.add(getenv(name))
	}
	return a
}

// isTerminal reports whether f is a character device (a terminal), not a file or a pipe.
func isTerminal(f any) bool {
	file, ok := f.(*os.File)
	if !ok {
		return false
	}
	fi, err := file.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// command is one subcommand.
type command struct {
	name, args, summary string
	run                 func(a *app, ctx context.Context, args []string) error
}

var commands []command

func init() {
	commands = []command{
		{"migrate", "[--dry-run | --check | --script --dialect D]", "create or upgrade the outbox's tables", (*app).migrate},
		{"status", "[--json]", "backlog, lag, leases, dead letters and inbox sizes", (*app).status},
		{"dead-letters", "list|show|replay|discard ...", "look at dead letters, replay or discard them", (*app).deadLetters},
		{"relay", "--transport URL [--route TYPE=DEST]... | --config FILE", "deliver the outbox (or those of FILE) to a broker until stopped", (*app).relay},
		{"log", "drop", "drop the log relay's replication slot and publication (PostgreSQL)", (*app).logCommand},
		{"prune", "--inbox-retention D | --dead-letters-retention D", "delete old inbox keys and settled dead letters", (*app).prune},
		{"serve", "[--listen ADDR] [--allow-actions]", "a web console for the status and the dead letters", (*app).serve},
		{"version", "[--json]", "print the version", (*app).version},
	}
}

func (a *app) usage(w io.Writer) {
	fmt.Fprintln(w, "usage: outbox COMMAND [flags]")
	fmt.Fprintln(w)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-13s %s\n  %-13s   %s\n", c.name, c.args, "", c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "The database is OUTBOX_DATABASE_URL or --database-url: postgres://…, mysql://…,")
	fmt.Fprintln(w, "sqlite:///path/to/file.db or a file path. \"outbox COMMAND -h\" lists a command's flags.")
	fmt.Fprintln(w, "Exit codes: 0 ok, 1 failure, 2 usage, 3 not found, 4 refused by the entry, 5 schema not current.")
}

// run runs the command line args and returns the exit code.
func (a *app) run(ctx context.Context, args []string) int {
	if len(args) == 0 {
		a.usage(a.stderr)
		return exitUsage
	}
	name := args[0]
	if name == "help" || name == "-h" || name == "--help" {
		a.usage(a.stdout)
		return exitOK
	}
	for _, c := range commands {
		if c.name == name {
			return a.exit(c.run(a, ctx, args[1:]))
		}
	}
	fmt.Fprintf(a.stderr, "outbox: unknown command %q\n\n", name)
	a.usage(a.stderr)
	return exitUsage
}

// usageError is a mistake in the command line: a bad flag, value or argument.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// errQuiet ends a run with an exit code and nothing more to say.
type errQuiet struct{ code int }

func (e errQuiet) Error() string { return fmt.Sprintf("exit %d", e.code) }

// exit prints err (redacted) and maps it to an exit code.
func (a *app) exit(err error) int {
	if err == nil {
		return exitOK
	}
	var quiet errQuiet
	if errors.As(err, &quiet) {
		return quiet.code
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	// The library's own errors start with "outbox: " too: say it once.
	fmt.Fprintf(a.stderr, "outbox: %s\n", cleanBlock(strings.TrimPrefix(err.Error(), "outbox: ")))
	var usage usageError
	switch {
	case errors.As(err, &usage):
		return exitUsage
	case errors.Is(err, deadletter.ErrNotFound):
		return exitNotFound
	case errors.Is(err, deadletter.ErrNotPending), errors.Is(err, deadletter.ErrNotReplayable):
		return exitRefused
	case errors.Is(err, sqlstore.ErrSchema):
		return exitSchema
	}
	return exitFailure
}

// flags returns a flag set for command name whose errors and help go to stderr.
func (a *app) flags(name, args string) *flag.FlagSet {
	fs := flag.NewFlagSet("outbox "+name, flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	fs.Usage = func() {
		fmt.Fprintf(a.stderr, "usage: outbox %s %s\n\nflags:\n", name, args)
		fs.PrintDefaults()
	}
	return fs
}

// envString is a string flag whose default comes from the environment. Its value is never
// printed as a default (usage, -h, a flag error's usage): it may be a URL with a password.
type envString struct {
	p   *string
	set bool // by the command line
}

func (e *envString) String() string {
	if e == nil || e.p == nil || !e.set {
		return ""
	}
	return *e.p
}

func (e *envString) Set(s string) error { *e.p, e.set = s, true; return nil }

// envFlag registers the string flag name on fs, defaulting to the environment variable
// env. The usage says whether env is set, never its value.
func (a *app) envFlag(fs *flag.FlagSet, p *string, name, env, usage string) {
	*p = a.getenv(env)
	note := " (env " + env + ")"
	if *p != "" {
		note = " (env " + env + ", which is set)"
	}
	fs.Var(&envString{p: p}, name, usage+note)
}

// parse parses args with fs, flags and positional arguments in any order ("show 42 --json"
// as well as "show --json 42"), and returns the positional ones.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageError{err}
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

// noArgs fails on positional arguments a command does not take.
func noArgs(args []string) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q", strings.Join(args, " "))
	}
	return nil
}
