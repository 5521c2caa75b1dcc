package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/outboxdriver"
)

// This file is what the relay that reads PostgreSQL's log (adapters/pgx/pglog) needs of the
// polling store's internals: rows read from the log parsed as a claim parses them, and the
// move of scheduled events, which its streaming claims do not make.

// TextRow is an outbox row as PostgreSQL's logical replication sends it: every column in its
// text form (bytea already decoded from hex), headers "" for NULL.
type TextRow struct {
	Seq                                 int64
	ID, Type, Key, Headers, ContentType string
	Body                                []byte
	CreatedAt                           string
}

// Message parses r as a claim parses a row (see outboxRow.message): the error names each
// column that could not be read, or the rule of outbox.Message the row breaks.
func (r TextRow) Message() (outbox.Message, error) {
	row := outboxRow{seq: r.Seq, id: r.ID, typ: r.Type, key: r.Key, headers: r.Headers, contentType: r.ContentType, body: r.Body}
	_ = row.createdAt.Scan(r.CreatedAt) // never fails: an unreadable time is kept in createdAt.err
	return row.message()
}

// MoveDue moves the scheduled events of store (a store of this package, from Dialect.Store)
// that fell due into its outbox, as its claims do before claiming; it costs nothing until
// the next one is due or the recheck interval passed. For a store of another kind it does
// nothing.
func MoveDue(ctx context.Context, store outboxdriver.Store) error {
	c, ok := store.(*classifiedStore)
	if !ok {
		return nil
	}
	if err := c.due.move(ctx, c.d, c.db, c.n); err != nil {
		return Classify(err, c.n)
	}
	return nil
}

// The replication slot and the publication of a relay that reads n's outbox from the log
// (outboxpglog, `outbox migrate --log`, `outbox log drop`, `outbox status`).

// DefaultLogName is the default name of both the slot and the publication of n's log relay:
// "txoutbox_" followed by the schema and "_" (if any) and the outbox table's name, lower-cased.
func DefaultLogName(n *Names) string {
	name := "txoutbox_" + n.Prefix
	if n.Schema != "" {
		name = "txoutbox_" + n.Schema + "_" + n.Prefix
	}
	return strings.ToLower(name)
}

var logNameRe = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// CheckLogName says what is wrong with a slot or publication name, if anything: the
// server's rule for slot names (lower-case letters, digits and _, at most 63), which
// makes it safe to splice into SQL.
func CheckLogName(what, name string) error {
	if !logNameRe.MatchString(name) {
		return fmt.Errorf("%s %q is not 1 to 63 lower-case letters, digits and _", what, name)
	}
	return nil
}

// CreatePublication creates the publication pub of n's outbox inserts if it does not exist.
func CreatePublication(ctx context.Context, q Querier, n *Names, pub string) error {
	if err := CheckLogName("publication", pub); err != nil {
		return err
	}
	exists, err := PublicationExists(ctx, q, pub)
	if err != nil || exists {
		return err
	}
	// PostgreSQL 15+ publishes only the columns a message is made of: the walsender then
	// formats 8 columns of each insert instead of 15.
	var version int
	if _, err := scanRow(ctx, q, []any{&version}, "SELECT current_setting('server_version_num')::int"); err != nil {
		return err
	}
	columns := ""
	if version >= 150000 {
		columns = " (seq, id, type, key, headers, content_type, body, created_at)"
	}
	err = q.Exec(ctx, "CREATE PUBLICATION "+pub+" FOR TABLE "+n.Outbox+columns+" WITH (publish = 'insert')")
	if isDuplicateObject(err) { // created meanwhile
		return nil
	}
	if err != nil {
		return fmt.Errorf("creating publication %s: %w", pub, Classify(err, n))
	}
	return nil
}

// PublicationExists reports whether the publication pub exists.
func PublicationExists(ctx context.Context, q Querier, pub string) (bool, error) {
	return scanRow(ctx, q, nil, "SELECT FROM pg_publication WHERE pubname = $1", pub)
}

// DropLog drops the slot and the publication, if they exist. A slot that a relay reads
// cannot be dropped: the server's error says so.
func DropLog(ctx context.Context, q Querier, slot, pub string) error {
	if err := errors.Join(CheckLogName("slot", slot), CheckLogName("publication", pub)); err != nil {
		return err
	}
	if err := DropSlot(ctx, q, slot); err != nil {
		return err
	}
	if err := q.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pub); err != nil {
		return fmt.Errorf("dropping publication %s: %w", pub, err)
	}
	return nil
}

// CreateSlot creates the logical replication slot (pgoutput) if it does not exist, and
// reports whether it did. It waits for the transactions running on the server to end (the
// slot's consistent point).
func CreateSlot(ctx context.Context, q Querier, slot string) (bool, error) {
	if err := CheckLogName("slot", slot); err != nil {
		return false, err
	}
	err := q.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)
	switch {
	case isDuplicateObject(err): // created meanwhile
		return false, nil
	case err != nil:
		return false, fmt.Errorf("creating replication slot %s: %w", slot, err)
	}
	return true, nil
}

// DropSlot drops the replication slot if it exists. A slot that a relay reads cannot be
// dropped: the server's error says so.
func DropSlot(ctx context.Context, q Querier, slot string) error {
	if _, err := scanRow(ctx, q, nil, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", slot); err != nil {
		return fmt.Errorf("dropping replication slot %s: %w", slot, err)
	}
	return nil
}

// ReadSlot reads the state of the replication slot: whether it exists and is read, and the
// WAL it keeps. Mode is left empty (only the store in a relay knows it).
func ReadSlot(ctx context.Context, q Querier, slot string) (outboxdriver.SlotStats, error) {
	st := outboxdriver.SlotStats{Name: slot}
	var walStatus *string
	found, err := scanRow(ctx, q, []any{&st.Active, &st.RetainedWAL, &st.Lag, &walStatus}, `SELECT active,
       coalesce(pg_current_wal_lsn() - restart_lsn, 0)::bigint,
       coalesce(pg_current_wal_lsn() - confirmed_flush_lsn, 0)::bigint,
       wal_status
  FROM pg_replication_slots WHERE slot_name = $1`, slot)
	if err != nil {
		return st, fmt.Errorf("reading slot %s: %w", slot, err)
	}
	st.Exists = found
	if walStatus != nil {
		st.WALStatus = *walStatus
	}
	return st, nil
}

// isDuplicateObject reports whether err is PostgreSQL's duplicate_object (42710): the
// publication or slot was created meanwhile.
func isDuplicateObject(err error) bool {
	return walk(err, func(e error) bool {
		state, ok := sqlState(e)
		return ok && state == "42710"
	})
}
