package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/internal/sqlstore"
)

func (a *app) deadLetters(ctx context.Context, args []string) error {
	sub := map[string]func(context.Context, []string) error{
		"list": a.dlList, "show": a.dlShow, "replay": a.dlReplay, "discard": a.dlDiscard,
	}
	if len(args) == 0 || sub[args[0]] == nil {
		fmt.Fprintln(a.stderr, "usage: outbox dead-letters list|show|replay|discard [flags]")
		fmt.Fprintln(a.stderr, "  list [filters] [--json]               the dead letters that match, in ID order")
		fmt.Fprintln(a.stderr, "  show ID [--json]                      one entry: event, headers, payload, raw evidence")
		fmt.Fprintln(a.stderr, "  replay ID... | --all-matching FILTERS put the events back into the outbox")
		fmt.Fprintln(a.stderr, "  discard ID... | --all-matching FILTERS mark them discarded (kept for audit)")
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			return nil
		}
		if len(args) == 0 {
			return usagef("dead-letters needs a subcommand")
		}
		return usagef("dead-letters: unknown subcommand %q", args[0])
	}
	return sub[args[0]](ctx, args[1:])
}

// filterFlags are the dead-letter filters every subcommand that selects entries takes.
type filterFlags struct {
	eventType, stage, consumer, kind, reason, since, until, status, eventID, brokerID string
	id                                                                                int64
}

func (f *filterFlags) add(fs *flag.FlagSet, defaultStatus string) {
	fs.StringVar(&f.eventType, "type", "", "only events of this type")
	fs.StringVar(&f.stage, "stage", "", "only this stage: relay or consumer")
	fs.StringVar(&f.consumer, "consumer", "", "only this consumer's")
	fs.StringVar(&f.kind, "kind", "", "only this kind: "+joinKinds())
	fs.StringVar(&f.reason, "reason", "", "only reasons that contain this text (case-sensitive)")
	fs.StringVar(&f.since, "since", "", "only entries that last failed at or after this time: RFC 3339, a date, or a duration ago (24h, 7d)")
	fs.StringVar(&f.until, "until", "", "only entries that last failed before this time (same forms as --since)")
	fs.StringVar(&f.status, "status", defaultStatus, "only this status: pending, replayed, discarded or all")
	fs.Int64Var(&f.id, "id", 0, "only the entry with this ID")
	fs.StringVar(&f.eventID, "event-id", "", "only the entries of this event ID")
	fs.StringVar(&f.brokerID, "broker-message-id", "", "only the malformed message with this broker message ID")
}

// filter validates the flags and returns the filter; every problem is named at once.
func (f *filterFlags) filter(now time.Time) (deadletter.Filter, error) {
	var flt deadletter.Filter
	var errs []error
	switch deadletter.Stage(f.stage) {
	case "", deadletter.StageRelay, deadletter.StageConsumer:
		flt.Stage = deadletter.Stage(f.stage)
	default:
		errs = append(errs, fmt.Errorf("--stage %q: want relay or consumer", f.stage))
	}
	switch deadletter.Status(f.status) {
	case deadletter.StatusPending, deadletter.StatusReplayed, deadletter.StatusDiscarded:
		flt.Status = deadletter.Status(f.status)
	case "all", "":
	default:
		errs = append(errs, fmt.Errorf("--status %q: want pending, replayed, discarded or all", f.status))
	}
	if f.kind != "" && !slices.Contains(kinds, deadletter.Kind(f.kind)) {
		errs = append(errs, fmt.Errorf("--kind %q: want one of %s", f.kind, joinKinds()))
	}
	flt.Kind = deadletter.Kind(f.kind)
	flt.EventType, flt.Consumer, flt.ReasonContains, flt.BrokerMessageID = f.eventType, f.consumer, f.reason, f.brokerID
	if f.eventID != "" {
		id, err := uuid.Parse(f.eventID)
		if err != nil {
			errs = append(errs, fmt.Errorf("--event-id %q is not a UUID", f.eventID))
		}
		flt.EventID = id
	}
	var err error
	if flt.Since, err = parseWhen(f.since, now); err != nil {
		errs = append(errs, fmt.Errorf("--since: %w", err))
	}
	if flt.Until, err = parseWhen(f.until, now); err != nil {
		errs = append(errs, fmt.Errorf("--until: %w", err))
	}
	if f.id < 0 {
		errs = append(errs, fmt.Errorf("--id %d is negative", f.id))
	}
	if len(errs) > 0 {
		return flt, usageError{errors.Join(errs...)}
	}
	return flt, nil
}

// describe says what the filter selects, for the confirmation prompt.
func (f *filterFlags) describe() string {
	var parts []string
	add := func(name, v string) {
		if v != "" {
			parts = append(parts, name+"="+strconv.Quote(v))
		}
	}
	add("type", f.eventType)
	add("stage", f.stage)
	add("consumer", f.consumer)
	add("kind", f.kind)
	add("reason", f.reason)
	add("since", f.since)
	add("until", f.until)
	add("event-id", f.eventID)
	add("broker-message-id", f.brokerID)
	if f.id != 0 {
		add("id", strconv.FormatInt(f.id, 10))
	}
	if len(parts) == 0 {
		return "every pending entry"
	}
	return strings.Join(parts, " ")
}

var kinds = []deadletter.Kind{deadletter.KindGaveUp, deadletter.KindPermanent, deadletter.KindTooLarge,
	deadletter.KindUnreadableRow, deadletter.KindMalformed, deadletter.KindUnknownType, deadletter.KindUndecodable, deadletter.KindHeld,
	deadletter.KindBlobMissing}

func joinKinds() string {
	s := make([]string, len(kinds))
	for i, k := range kinds {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}

// parseWhen reads a time: RFC 3339, a date (UTC midnight), or a duration before now (90m,
// 24h, 7d). "" is no bound.
func parseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse("2006-01-02", s); err == nil {
		return t, nil
	}
	if d, err := parseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q is not a time (2026-11-23T10:00:00Z), a date (2026-11-23) or a duration ago (24h, 7d)", s)
}

// parseDuration is time.ParseDuration that also takes whole days ("7d").
func parseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%q is not a duration", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q is not a duration (90m, 24h, 7d)", s)
	}
	return d, nil
}

// durationFlag is a flag.Value for durations that take days too.
type durationFlag struct {
	d    time.Duration
	text string // as given, for messages
	set  bool
}

func (f *durationFlag) String() string { return f.text }
func (f *durationFlag) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	f.d, f.text, f.set = d, s, true
	return nil
}

func (a *app) dlList(ctx context.Context, args []string) error {
	fs := a.flags("dead-letters list", "[filters] [--limit N] [--after ID] [--json]")
	var f dbFlags
	f.add(a, fs)
	var ff filterFlags
	ff.add(fs, "pending")
	limit := fs.Int("limit", 50, "at most this many entries (up to 10,000)")
	after := fs.Int64("after", 0, "only entries with a larger ID: the next page starts after the last ID shown")
	asJSON := fs.Bool("json", false, "print the entries as JSON")
	rest, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(rest); err != nil {
		return err
	}
	flt, err := ff.filter(time.Now())
	if err != nil {
		return err
	}
	if *limit < 1 || *limit > 10000 {
		return usagef("--limit %d is outside 1..10000", *limit)
	}
	flt.Limit, flt.AfterID = *limit, *after
	s, err := a.open(ctx, f, false)
	if err != nil {
		return err
	}
	defer s.Close()
	entries, err := s.summaries(ctx, flt, ff.id)
	if err != nil {
		return a.stderr.hide(err)
	}
	if *asJSON {
		out := make([]entryJSON, len(entries))
		for i, e := range entries {
			out[i] = summaryJSON(e)
		}
		return printJSON(a.stdout, out)
	}
	if len(entries) == 0 {
		fmt.Fprintln(a.stderr, "no dead letters match")
		return nil
	}
	t := newTable(a.stdout, "ID", "STATUS", "STAGE", "KIND", "TYPE", "CONSUMER", "ATTEMPTS", "LAST FAILED", "REASON")
	for _, e := range entries {
		t.row(strconv.FormatInt(e.ID, 10), string(e.Status), string(e.Stage), orDash(string(e.Kind)), orDash(cut(e.Message.Type, 40)),
			orDash(cut(e.Consumer, 24)), strconv.Itoa(e.Attempts), stamp(e.LastFailedAt), cut(e.Reason, 48))
	}
	t.flush()
	if len(entries) == flt.Limit {
		fmt.Fprintf(a.stderr, "more may match: add --after %d for the next page\n", entries[len(entries)-1].ID)
	}
	return nil
}

func (a *app) dlShow(ctx context.Context, args []string) error {
	fs := a.flags("dead-letters show", "ID [--json | --body | --raw]")
	var f dbFlags
	f.add(a, fs)
	asJSON := fs.Bool("json", false, "print the entry as JSON, whole")
	body := fs.Bool("body", false, "write the event's body to stdout, whole and as it is (redirect it to a file)")
	raw := fs.Bool("raw", false, "write the raw evidence to stdout, whole and as it is (txoutbox-raw/1 text: fields, a blank line, the body as received)")
	rest, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return usagef("dead-letters show takes one ID, got %d arguments", len(rest))
	}
	if n := btoi(*asJSON) + btoi(*body) + btoi(*raw); n > 1 {
		return usagef("--json, --body and --raw exclude each other")
	}
	id, err := parseID(rest[0])
	if err != nil {
		return err
	}
	s, err := a.open(ctx, f, false)
	if err != nil {
		return err
	}
	defer s.Close()
	switch {
	case *asJSON:
		e, err := s.deadLetters().Get(ctx, id)
		if err != nil {
			return a.stderr.hide(err)
		}
		return printJSON(a.stdout, toJSON(e))
	case *body || *raw:
		column := "body"
		if *raw {
			column = "raw"
		}
		found, err := s.copyBytes(ctx, a.stdout, id, column, nil)
		if err != nil {
			return a.stderr.hide(err)
		}
		if !found {
			if *raw {
				if _, err := s.deadLetters().Get(ctx, id); err != nil {
					return a.stderr.hide(err)
				}
				return fmt.Errorf("dead letter %d has no raw evidence", id)
			}
			return fmt.Errorf("%w: %d", deadletter.ErrNotFound, id)
		}
		return nil
	}
	e, err := sqlstore.PreviewDeadLetter(ctx, s.dialect, s.q, s.names, id, previewBytes)
	if err != nil {
		return a.stderr.hide(err)
	}
	a.printEntry(e)
	return nil
}

func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, usagef("%q is not a dead letter ID (a positive integer)", s)
	}
	return id, nil
}

// printEntry prints e for people: every text made safe for the terminal, the payload and
// the raw evidence as far as the preview goes, and how to get the rest.
func (a *app) printEntry(e sqlstore.DeadLetterPreview) {
	w := a.stdout
	m := e.Message
	line := func(name, v string) { fmt.Fprintf(w, "%-18s %s\n", name, clean(v)) }
	line("id", strconv.FormatInt(e.ID, 10))
	line("status", string(e.Status)+whenChanged(e.Entry))
	line("stage", string(e.Stage))
	line("kind", orDash(string(e.Kind)))
	if e.Consumer != "" {
		line("consumer", e.Consumer)
	}
	line("attempts", strconv.Itoa(e.Attempts))
	line("first failed", stamp(e.FirstFailedAt))
	line("last failed", stamp(e.LastFailedAt))
	line("reason", e.Reason)
	if e.BrokerMessageID != "" {
		line("broker message id", e.BrokerMessageID)
	}
	if m.ID != uuid.Nil {
		line("event id", m.ID.String())
	}
	line("type", orDash(m.Type))
	if m.Key != "" {
		line("key", m.Key)
	}
	line("content type", orDash(m.ContentType))
	line("created", stamp(m.CreatedAt))
	if len(m.Headers) > 0 {
		fmt.Fprintln(w, "headers")
		for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
			fmt.Fprintf(w, "  %s: %s\n", clean(k), clean(m.Headers[k]))
		}
	}
	fmt.Fprintf(w, "payload (%s bytes)\n", count(e.BodyBytes))
	fmt.Fprintln(w, indent(payloadText(m.Body), "  "))
	if e.BodyBytes > int64(len(m.Body)) {
		fmt.Fprintf(w, "  … cut after %s bytes: outbox dead-letters show --body %d > FILE writes it whole\n", count(len(m.Body)), e.ID)
	}
	if r := e.Raw; r != nil {
		fmt.Fprintln(w, "raw evidence (as received, before anything was changed to store it)")
		fields := *r
		fields.Body = nil
		head, _ := fields.MarshalText()
		fmt.Fprintln(w, indent(cleanBlock(strings.TrimSuffix(string(head), "\n")), "  "))
		if len(r.Body) > 0 {
			fmt.Fprintf(w, "  body (%s bytes shown):\n", count(len(r.Body)))
			fmt.Fprintln(w, indent(rawBytes(r.Body), "    "))
		}
		if e.RawCut {
			fmt.Fprintf(w, "  … cut after %s of %s bytes: outbox dead-letters show --raw %d > FILE writes it whole\n", count(previewBytes), count(e.RawBytes), e.ID)
		}
	}
}

func whenChanged(e deadletter.Entry) string {
	if e.StatusChangedAt.IsZero() {
		return ""
	}
	return " (since " + stamp(e.StatusChangedAt) + ")"
}

// payloadText is a payload for people: JSON pretty-printed, other text as it is (made
// safe), bytes that are not text as a hex dump.
func payloadText(body []byte) string {
	if len(body) == 0 {
		return "(empty)"
	}
	var pretty bytes.Buffer
	if json.Valid(body) && json.Indent(&pretty, body, "", "  ") == nil {
		return cleanBlock(pretty.String())
	}
	return rawBytes(body)
}

// rawBytes shows bytes as text when they are UTF-8 (each line made safe, see clean), as a
// hex dump otherwise.
func rawBytes(b []byte) string {
	if utf8.Valid(b) {
		return cleanBlock(string(b))
	}
	return strings.TrimRight(hex.Dump(b), "\n")
}

func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

func (a *app) dlReplay(ctx context.Context, args []string) error {
	return a.dlAct(ctx, "replay", args)
}

func (a *app) dlDiscard(ctx context.Context, args []string) error {
	return a.dlAct(ctx, "discard", args)
}

// dlAct replays or discards the entries named by ID, or every pending entry that matches
// the filters with --all-matching (after a confirmation, unless --yes).
func (a *app) dlAct(ctx context.Context, verb string, args []string) error {
	fs := a.flags("dead-letters "+verb, "ID... | --all-matching [filters] [--yes]")
	var f dbFlags
	f.add(a, fs)
	var ff filterFlags
	ff.add(fs, "pending")
	all := fs.Bool("all-matching", false, "act on every pending entry that matches the filters")
	yes := fs.Bool("yes", false, "with --all-matching: do not ask for confirmation")
	mode := fs.String("progress", "auto", "progress report: auto (a bar on a terminal, lines otherwise), bar, lines or none")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	rest, err := parse(fs, args)
	if err != nil {
		return err
	}
	if !slices.Contains([]string{"auto", "bar", "lines", "none"}, *mode) {
		return usagef("--progress %q: want auto, bar, lines or none", *mode)
	}
	flt, err := ff.filter(time.Now())
	if err != nil {
		return err
	}
	var ids []int64
	switch {
	case *all && len(rest) > 0:
		return usagef("give IDs or --all-matching, not both")
	case !*all && len(rest) == 0:
		return usagef("dead-letters %s needs IDs, or --all-matching with filters", verb)
	case !*all:
		if ff.describe() != "every pending entry" || ff.status != "pending" {
			return usagef("filters select entries for --all-matching; with IDs, give no filters")
		}
		for _, r := range rest {
			id, err := parseID(r)
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
	}
	if *all {
		if flt.Status != deadletter.StatusPending {
			return usagef("--all-matching acts on pending entries only; --status %q selects none of them", ff.status)
		}
		if !*yes && !a.stdinTerminal {
			return usagef("--all-matching asks for confirmation on a terminal; without one, add --yes")
		}
	}
	s, err := a.open(ctx, f, false)
	if err != nil {
		return err
	}
	defer s.Close()
	t := s.deadLetters()
	act := deadletter.ReplayEach
	past := "replayed"
	if verb == "discard" {
		act, past = deadletter.DiscardEach, "discarded"
	}
	if *all { // ids are those that match, counted once, confirmed
		if ids, err = s.matching(ctx, flt, ff.id); err != nil {
			return a.stderr.hide(err)
		}
		if len(ids) == 0 {
			fmt.Fprintf(a.stderr, "no pending dead letters match %s: nothing to %s\n", ff.describe(), verb)
			if *asJSON {
				return printJSON(a.stdout, bulkJSON{Matched: 0, Refused: []refusedJSON{}})
			}
			return nil
		}
		if !*yes {
			ok, err := a.confirm(fmt.Sprintf("%s %s dead letters (%s) in %s? [y/N] ", strings.ToUpper(verb[:1])+verb[1:], count(len(ids)), ff.describe(), s.describe()))
			if err != nil {
				return err
			}
			if !ok {
				fmt.Fprintln(a.stderr, "nothing changed")
				return errQuiet{exitFailure}
			}
		}
	}
	if !*all {
		return a.actOnIDs(ctx, map[string]func(context.Context, int64) error{"replay": t.Replay, "discard": t.Discard}[verb], past, ids, *asJSON)
	}
	p := a.newProgress(*mode, strings.TrimSuffix(past, "ed")+"ing", len(ids))
	r, err := act(ctx, t, ids, p.update)
	if err != nil {
		err = a.stderr.hide(err)
	}
	return a.bulkResult(past, len(ids), r, err, *asJSON)
}

// actOnIDs replays or discards entries named on the command line, each on its own, and
// reports each. The error joins those of the entries, so the exit code says why (3 not
// found, 4 refused).
func (a *app) actOnIDs(ctx context.Context, act func(context.Context, int64) error, past string, ids []int64, asJSON bool) error {
	var errs []error
	out := bulkJSON{Matched: len(ids), Refused: []refusedJSON{}}
	for _, id := range ids {
		if err := act(ctx, id); err != nil {
			err = a.stderr.hide(err)
			errs = append(errs, err)
			out.Refused = append(out.Refused, refusedJSON{ID: id, Reason: err.Error()})
			continue
		}
		out.Done++
		if !asJSON {
			fmt.Fprintf(a.stdout, "%s %d\n", past, id)
		}
	}
	if asJSON {
		if err := printJSON(a.stdout, out); err != nil {
			return err
		}
	}
	return errors.Join(errs...)
}

type bulkJSON struct {
	Matched int           `json:"matched"`
	Done    int           `json:"done"`
	Skipped int           `json:"skipped"`
	Refused []refusedJSON `json:"refused"`
	Error   string        `json:"error,omitempty"`
}

type refusedJSON struct {
	ID     int64  `json:"id"`
	Reason string `json:"reason"`
}

// bulkResult prints the final count of a replay or discard and picks the exit code.
func (a *app) bulkResult(past string, matched int, r deadletter.BulkResult, runErr error, asJSON bool) error {
	refused := []refusedJSON{}
	for _, id := range slices.Sorted(maps.Keys(r.Refused)) {
		refused = append(refused, refusedJSON{ID: id, Reason: a.stderr.redact(r.Refused[id].Error())})
	}
	if asJSON {
		out := bulkJSON{Matched: matched, Done: r.Done, Skipped: r.Skipped, Refused: refused}
		if runErr != nil {
			out.Error = runErr.Error()
		}
		if err := printJSON(a.stdout, out); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(a.stdout, "%s %s of %s", past, count(r.Done), count(matched))
		if r.Skipped > 0 {
			fmt.Fprintf(a.stdout, ", skipped %s no longer pending or gone", count(r.Skipped))
		}
		if len(refused) > 0 {
			fmt.Fprintf(a.stdout, ", refused %s that cannot be replayed", count(len(refused)))
		}
		fmt.Fprintln(a.stdout)
		for _, x := range refused {
			fmt.Fprintf(a.stderr, "  %d: %s\n", x.ID, x.Reason)
		}
	}
	switch {
	case runErr != nil:
		if asJSON {
			fmt.Fprintf(a.stderr, "outbox: %v\n", runErr)
			return errQuiet{exitFailure}
		}
		return runErr
	case len(refused) > 0:
		return errQuiet{exitRefused}
	}
	return nil
}

// confirm asks a yes/no question on the terminal.
func (a *app) confirm(question string) (bool, error) {
	fmt.Fprint(a.stderr, question)
	line, err := bufio.NewReader(a.stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	answer := strings.ToLower(strings.TrimSpace(line))
	return answer == "y" || answer == "yes", nil
}
