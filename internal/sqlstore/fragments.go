package sqlstore

import (
	"context"
	"strconv"
	"time"
)

// dialectSQL is a dialect's part of the SQL that every dialect shares: the dead-letter table,
// held keys, the inbox's common statements, stats and the operator's queries are written
// once with "?" placeholders and these fragments, and each dialect's values live in its own
// file (postgres.go, mysql.go, sqlite.go).
type dialectSQL struct {
	// now is the database clock.
	now string
	// rebind turns "?" placeholders into the dialect's.
	rebind func(query string) string
	// key is the outbox's key column, quoted where it is a reserved word.
	key string
	// heldAt is a held row's available_at: later than any time the clock writes (hold.go).
	heldAt string

	// headers and eventID are those columns as text ('' for none); epoch stands for a
	// status_changed_at that is NULL.
	headers, eventID, epoch string
	// size is the size in bytes of the binary column col (NULL for NULL).
	size func(col string) string
	// uuidParam is a placeholder compared with a uuid column; jsonParam one written to a
	// headers column.
	uuidParam, jsonParam string

	// bindTime binds a time the way the database clock writes it (failure and status
	// times, and filters on them); bindCreated binds created_at the way Insert writes it.
	bindTime, bindCreated func(t time.Time) any
	// contains is the condition "reason contains ?" (case-sensitive).
	contains string
	// ago is the database clock minus d, with its argument.
	ago func(d time.Duration) (expr string, arg any)
	// lockRows ends a read that locks the rows it reads until the transaction ends ("" where
	// a write transaction holds the whole database already).
	lockRows string
	// skipLocked ends a read that locks the rows it reads and skips those another
	// transaction holds (the scheduled events' move: scheduled.go).
	skipLocked string
	// replayHeaders is the headers column with outbox.ReplayHeader set to the argument.
	replayHeaders string
	// bucket is the start, in whole seconds since 1970, of the interval of secs seconds (an
	// integer literal) that the time column col falls in.
	bucket func(col, secs string) string
	// tableExists returns the query (with its arguments) that returns a row when the table
	// called name, in n's schema, exists.
	tableExists func(n *Names, name string) (string, []any)

	// lim is what the dead-letter table's columns hold; dlTuple the placeholders of one of
	// its rows (in dlColumns order) and dlMaxRows how many rows one INSERT may carry.
	lim       textLimits
	dlTuple   string
	dlMaxRows int
	// deleteSome deletes up to limit rows of table that match where (with args) and
	// returns how many it deleted.
	deleteSome func(ctx context.Context, q Querier, table, where string, args []any, limit int) (int64, error)
	// books is the bookkeeping of the migrations applied to n.
	books func(n *Names) books
}

// sql implements Dialect for the dialect types, which embed their dialectSQL.
func (s *dialectSQL) sql() *dialectSQL { return s }

// numbered turns the "?" placeholders of query into $1, $2… (PostgreSQL's).
func numbered(query string) string {
	out := make([]byte, 0, len(query)+16)
	n := 0
	for i := 0; i < len(query); i++ {
		if query[i] != '?' {
			out = append(out, query[i])
			continue
		}
		n++
		out = append(out, '$')
		out = strconv.AppendInt(out, int64(n), 10)
	}
	return string(out)
}

// same is rebind for dialects whose placeholders are "?".
func same(query string) string { return query }
