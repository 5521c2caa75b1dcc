// Package deadletter is the dead-letter table shared by the relay and the consumers: events
// that could not be delivered (stage "relay") or handled (stage "consumer"), with the reason,
// the attempt count and when they failed. People list them, look at one, replay it — back
// through the outbox, in one transaction with the status change — or discard it (the row is
// kept for audit).
//
// Each SQL adapter opens the table of its outbox: outboxpgx.NewDeadLetters(pool),
// outboxsql.NewDeadLetters…; they all return a [Table].
package deadletter

import (
	"context"
	"errors"
	"time"

	"github.com/txoutbox/outbox"
)

// Stage says where an event failed.
type Stage string

// Stages.
const (
	StageRelay    Stage = "relay"
	StageConsumer Stage = "consumer"
)

// Status is what happened to a dead letter since.
type Status string

// Statuses.
const (
	StatusPending   Status = "pending"
	StatusReplayed  Status = "replayed"
	StatusDiscarded Status = "discarded"
)

// Entry is one dead letter.
type Entry struct {
	ID       int64 // the dead letter's own ID
	Message  outbox.Message
	Stage    Stage
	Consumer string // consumer name, for StageConsumer
	Reason   string
	Attempts int

	FirstFailedAt   time.Time
	LastFailedAt    time.Time
	Status          Status
	StatusChangedAt time.Time // zero while pending
}

// Filter selects dead letters for [Table.List]. Zero fields match everything.
type Filter struct {
	Status    Status
	Stage     Stage
	Consumer  string
	EventType string
	// Since and Until bound LastFailedAt (Since inclusive, Until exclusive).
	Since, Until time.Time
	// AfterID pages: only entries with a larger ID. Entries come in ID order.
	AfterID int64
	// Limit caps the result. Default 100, at most 10,000.
	Limit int
}

// ErrNotFound is returned for a dead-letter ID that does not exist.
var ErrNotFound = errors.New("deadletter: no such dead letter")

// ErrNotPending is returned when replaying or discarding an entry that was already replayed
// or discarded.
var ErrNotPending = errors.New("deadletter: entry is not pending")

// Writer adds dead letters; the consumer runtime writes through it.
type Writer interface {
	Add(ctx context.Context, e Entry) error
}

// Table is the dead-letter table of one outbox.
type Table interface {
	Writer
	// List returns the entries that match f, in ID order.
	List(ctx context.Context, f Filter) ([]Entry, error)
	// Get returns one entry.
	Get(ctx context.Context, id int64) (Entry, error)
	// Replay puts a pending entry's event back into the outbox (same event ID, so
	// idempotent consumers that already handled it skip it) and marks the entry replayed, in
	// one transaction.
	Replay(ctx context.Context, id int64) error
	// Discard marks a pending entry discarded; the row stays for audit.
	Discard(ctx context.Context, id int64) error
}
