package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"

	"github.com/txoutbox/outbox/internal/sqlstore"
)

// This file is what the command knows of the relay that reads PostgreSQL's log
// (outboxpglog): the flags that name its slot and publication, and `outbox log drop`.

// logFlags are --log and the names of the log relay's slot and publication.
type logFlags struct {
	on                bool
	slot, publication string
}

// add registers the flags on fs; usage says what --log does in this command ("" registers
// only the names).
func (l *logFlags) add(a *app, fs *flag.FlagSet, usage string) {
	if usage != "" {
		fs.BoolVar(&l.on, "log", false, usage)
	}
	a.envFlag(fs, &l.slot, "slot", "OUTBOX_SLOT", "the log relay's replication `slot` (default txoutbox_[<schema>_]<table>)")
	a.envFlag(fs, &l.publication, "publication", "OUTBOX_PUBLICATION", "the log relay's `publication` (default as --slot's)")
}

// slotOf and publicationOf are the names the flags give, or the defaults for n's outbox.
func (l *logFlags) slotOf(n *sqlstore.Names) string {
	return cmp.Or(l.slot, sqlstore.DefaultLogName(n))
}

func (l *logFlags) publicationOf(n *sqlstore.Names) string {
	return cmp.Or(l.publication, sqlstore.DefaultLogName(n))
}

// check validates the names the flags give.
func (l *logFlags) check() error {
	for flagName, v := range map[string]string{"--slot": l.slot, "--publication": l.publication} {
		if v == "" {
			continue
		}
		if err := sqlstore.CheckLogName(flagName, v); err != nil {
			return usageError{err}
		}
	}
	return nil
}

// logCommand is `outbox log drop`: it drops the log relay's slot and publication, for an
// outbox that goes back to polling (an unread slot keeps WAL on the server's disk).
func (a *app) logCommand(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "drop" {
		return usagef("log takes one subcommand: drop (the log relay's replication slot and publication)")
	}
	fs := a.flags("log drop", "[flags]")
	var f dbFlags
	f.add(a, fs)
	var lg logFlags
	lg.add(a, fs, "")
	rest, err := parse(fs, args[1:])
	if err != nil {
		return err
	}
	if err := noArgs(rest); err != nil {
		return err
	}
	if err := lg.check(); err != nil {
		return err
	}
	s, err := a.open(ctx, f, false)
	if err != nil {
		return err
	}
	defer s.Close()
	if s.dialect != sqlstore.Postgres {
		return usagef("log drop needs PostgreSQL: only its relay reads the log")
	}
	slot, pub := lg.slotOf(s.names), lg.publicationOf(s.names)
	if err := sqlstore.DropLog(ctx, s.q, slot, pub); err != nil {
		return a.stderr.hide(err)
	}
	fmt.Fprintf(a.stdout, "dropped slot %s and publication %s (where they existed); relays of %s poll\n", slot, pub, s.names.Outbox)
	return nil
}
