package main

import (
	"context"
	"fmt"
	"time"
)

// minInboxRetention is the shortest --inbox-retention prune takes without --force: inbox
// keys younger than a day are the ones a redelivery, a replay or a client's retry still
// needs, and a key pruned early lets its handler run twice.
const minInboxRetention = 24 * time.Hour

// pruneReport is what "outbox prune" deleted.
type pruneReport struct {
	InboxKeys   int64 `json:"inbox_keys"`
	DeadLetters int64 `json:"dead_letters"`
}

func (a *app) prune(ctx context.Context, args []string) error {
	fs := a.flags("prune", "--inbox-retention D | --dead-letters-retention D [flags]")
	var f dbFlags
	f.add(a, fs)
	var inbox, dead durationFlag
	fs.Var(&inbox, "inbox-retention", "delete inbox keys (and stored HTTP responses) older than this: 24h, 14d; keep it longer than the longest redelivery horizon. Under 24h needs --force")
	fs.Var(&dead, "dead-letters-retention", "delete dead letters replayed or discarded longer ago than this (pending ones are never deleted)")
	batch := fs.Int("batch", 10000, "rows deleted per statement; each statement is its own short transaction")
	force := fs.Bool("force", false, "allow an --inbox-retention under 24h")
	asJSON := fs.Bool("json", false, "print what was deleted as JSON")
	rest, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(rest); err != nil {
		return err
	}
	if !inbox.set && !dead.set {
		return usagef("prune needs --inbox-retention, --dead-letters-retention or both")
	}
	if inbox.set && inbox.d < minInboxRetention && !*force {
		return usagef("--inbox-retention %s is under %s: a redelivery or an HTTP retry after its key is gone runs its handler again, a second effect. "+
			"Keep keys longer than anything can redeliver (docs/delivery.md); add --force if you mean it", inbox.text, "24h")
	}
	if *batch < 1 || *batch > 1000000 {
		return usagef("--batch %d is outside 1..1000000", *batch)
	}
	s, err := a.open(ctx, f, false)
	if err != nil {
		return err
	}
	defer s.Close()
	var r pruneReport
	// Bounded batches until one deletes less than a batch: no statement holds locks long.
	drain := func(prune func() (int64, error), total *int64) error {
		for {
			n, err := prune()
			*total += n
			if err != nil || n < int64(*batch) {
				return err
			}
		}
	}
	if inbox.set {
		in, err := s.outbox.NewInbox(s.db)
		if err != nil {
			return err
		}
		if err := drain(func() (int64, error) { return in.Prune(ctx, inbox.d, *batch) }, &r.InboxKeys); err != nil {
			return a.stderr.hide(err)
		}
	}
	if dead.set {
		t := s.deadLetters()
		if err := drain(func() (int64, error) { return t.Prune(ctx, dead.d, *batch) }, &r.DeadLetters); err != nil {
			return a.stderr.hide(err)
		}
	}
	if *asJSON {
		return printJSON(a.stdout, r)
	}
	if inbox.set {
		fmt.Fprintf(a.stdout, "deleted %s inbox keys older than %s\n", count(r.InboxKeys), inbox.text)
	}
	if dead.set {
		fmt.Fprintf(a.stdout, "deleted %s dead letters replayed or discarded more than %s ago\n", count(r.DeadLetters), dead.text)
	}
	return nil
}
