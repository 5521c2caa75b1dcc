package sqlstore

import (
	"context"

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
