// Package outboxdriver is the contract between the relay and the stores that hold outboxes:
// for authors of a store (an adapter for another database or driver), not for applications,
// which call an adapter's Publish, NewStore and friends. River's riverdriver is the model.
//
// A store implements [Store]; [Validator] and [StatsReader] are optional. The conformance
// suite outboxtest.ExerciseStore checks a store for every behaviour the relay relies on
// (order per key, leases and fencing tokens, held keys, poison rows, outages), and
// [Encode] turns the events of a Publish call into messages exactly as this repository's
// adapters do (validation, encoding, the caller's trace context in the headers), so that a
// store of your own behaves like ours.
package outboxdriver

import (
	"context"
	"time"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/deadletter"
)

// Store is the relay's access to an outbox table. Adapters provide one
// (outboxpgx.Default.NewStore, outboxsql.Postgres.NewStore…); its methods are the relay's
// contract, which the conformance suite in outboxtest checks for every adapter.
// Applications do not call them.
//
// Every method but Claim takes the claim's token: a write for a row whose lease was taken
// over by a newer claim changes nothing, so a relay whose lease expired cannot clobber
// another relay's work.
type Store interface {
	// Claim leases up to Limit deliverable messages to the caller for Lease, stamping them
	// with Token, and counts an attempt on each. A message is deliverable when it is due, not
	// leased (or its lease expired) and no earlier message with the same key is leased or
	// waiting for a retry. Messages come back in outbox order.
	Claim(ctx context.Context, p ClaimParams) ([]Claimed, error)
	// Complete removes delivered messages.
	Complete(ctx context.Context, token int64, seqs []int64) error
	// Retry releases messages for another attempt after their delay, recording the error.
	Retry(ctx context.Context, token int64, retries []Retry) error
	// DeadLetter moves messages to the dead-letter table with a reason, and returns the seqs
	// it moved: those still carrying token (the relay reports exactly these as new dead
	// letters, to its OnDeadLetter hook, metrics and logs).
	DeadLetter(ctx context.Context, token int64, dead []DeadLetter) (moved []int64, err error)
	// Release gives messages back unsent, without counting the attempt (shutdown, a key
	// blocked by an earlier failure in the same claim, or a broker that is unavailable).
	Release(ctx context.Context, token int64, seqs []int64) error
}

// Validator is an optional interface of a [Store] (the SQL adapters' stores have it):
// [relay.Relay.Run] calls Validate before its first claim and stops with its error when that wraps
// [outbox.ErrSchema] — the outbox was never migrated, or by another version — instead of failing
// every claim for as long as it runs. Other errors (the database is down) are retried.
type Validator interface {
	Validate(ctx context.Context) error
}

// Runner is an optional interface of a [Store] that has work of its own while a relay runs
// (outboxpglog's store reads PostgreSQL's log of changes). [relay.Relay.Run] runs Run beside
// its claim loops and waits for it to return once its context ends; wake makes the relay
// claim now ([relay.Relay.Wake]), for a store that learns of new messages by itself. Run
// returns nil when ctx ends; any other error stops the relay, which returns it. A store
// shared by several relays is run once: later calls add their wake and wait for ctx.
type Runner interface {
	Run(ctx context.Context, wake func()) error
}

// ClaimParams are the arguments of [Store.Claim].
type ClaimParams struct {
	// Owner names the claiming relay (relay.Config.Name), for people reading the table.
	Owner string
	// Token fences the claim: every write-back of its messages must carry it.
	Token int64
	// Limit caps how many messages are claimed.
	Limit int
	// Lease is how long the messages stay the claimer's before another relay may take them.
	Lease time.Duration
	// Lane is which of the relay's claim loops claims (0 to Lanes-1; relay.Config.Concurrency
	// loops). A store that serialises the claims of ordered messages may give each lane a
	// share of the keys to claim from first, so that the loops' claims need not wait for
	// each other (PostgreSQL's does); it must never make order depend on it. Zero Lanes
	// is one lane.
	Lane, Lanes int
	// State is what the store remembers of the claim loop's earlier claims: the relay keeps
	// one per loop and passes it to each of the loop's claims in turn, never to two at once.
	// A store may keep there whatever sizes its next claim better (PostgreSQL's keeps whether
	// the loop's claims come back full, and how wide a window finds them enough); it must
	// never make order depend on it. nil is a claim without a history (Relay.RunOnce, tests):
	// the store claims as for a loop's first claim.
	State *ClaimState
}

// ClaimState is a claim loop's memory for its store ([ClaimParams.State]). What it holds is
// the store's own: the relay creates it empty and never reads it.
type ClaimState struct {
	// Store is the store's value, set by its first claim of the loop.
	Store any
}

// Claimed is a message leased by [Store.Claim].
type Claimed struct {
	// Seq is the message's position in the outbox; write-backs name messages by it.
	Seq int64
	// Attempts counts claims of this message, this one included.
	Attempts int
	// FirstFailedAt is when a send of the message first failed (the store's clock); zero
	// if none has. The relay's MaxRetryTime counts from it.
	FirstFailedAt time.Time
	// Message is the message as stored.
	Message outbox.Message
	// Err is set when the row could not be read into a valid Message (written by raw SQL,
	// a trigger or another producer: an id that is not a UUID, headers that are not a
	// JSON object of strings, a type or key that breaks the rules of [outbox.Message]…). It
	// names the column and the problem; Message holds what could be read. The relay
	// dead-letters such a row alone, and the store keeps its raw values.
	Err error
}

// Retry is one message to release for another attempt.
type Retry struct {
	// Seq names the message.
	Seq int64
	// Delay is how long from now before it may be claimed again.
	Delay time.Duration
	// Error is the failure, kept on the row for people reading the table.
	Error string
}

// DeadLetter is one message to move to the dead-letter table.
type DeadLetter struct {
	// Seq names the message.
	Seq int64
	// Reason is the failure, stored with the dead letter.
	Reason string
	// Kind classifies the failure for people filtering dead letters.
	Kind deadletter.Kind
	// HoldKey asks the store to hold the message's key (set only for a keyed message, by a
	// relay whose KeyPolicy is relay.HoldKey): the row stays in the outbox, never claimable, as
	// the first of its key, so the key's later messages wait behind it; the dead letter
	// records which row it holds. Replaying the dead letter makes that row deliverable
	// again, where it stood (it goes first); discarding it deletes the row (the key moves
	// on). Without HoldKey the row leaves the outbox.
	HoldKey bool
}

// StatsReader is implemented by the stores of the SQL adapters (an optional interface of
// [Store], found by type assertion): it reads the outbox's backlog and dead letters in one
// statement. The relay samples it for its gauges (txoutbox.outbox.backlog…) once per metric
// collection, not per event; operators' tools call it directly:
//
//	store, _ := outboxpgx.Default.NewStore(pool)
//	st, err := store.(outboxdriver.StatsReader).Stats(ctx)
type StatsReader interface {
	Stats(ctx context.Context) (Stats, error)
}

// Stats is a snapshot of one outbox: what waits to be delivered and what waits for a person.
// Its cost is one statement: counts of the undelivered rows and of the pending dead letters
// (both by index, O(rows counted)), and the oldest of each by index.
type Stats struct {
	// Outbox names the outbox table as configured ("outbox", or "schema.outbox").
	Outbox string
	// Backlog counts the messages in the outbox not yet delivered: due, leased, or waiting
	// for a retry.
	Backlog int64
	// OldestUndelivered is the CreatedAt of the oldest message in the backlog (the first in
	// outbox order); zero when the backlog is empty.
	OldestUndelivered time.Time
	// DeadLettersPending counts dead letters neither replayed nor discarded.
	DeadLettersPending int64
	// OldestPendingDeadLetter is when the oldest pending dead letter last failed; zero when
	// there is none.
	OldestPendingDeadLetter time.Time
	// HeldKeys counts the keys held by a pending dead letter of the relay (see [DeadLetter.HoldKey]):
	// their later messages wait in the backlog until it is replayed or discarded.
	HeldKeys int64
	// Scheduled counts the scheduled events not yet due (outbox.WithDeliverAt): they are
	// not in the backlog until the relay moves them into the outbox when they fall due.
	Scheduled int64
	// NextDue is when the first scheduled event falls due; zero when none is scheduled.
	NextDue time.Time
	// Slot is the replication slot of a store that reads the database's log (outboxpglog);
	// nil for a store that polls.
	Slot *SlotStats
}

// SlotStats describes the logical replication slot of a store that reads PostgreSQL's log.
type SlotStats struct {
	// Name is the slot's name; Exists is false when it was dropped or never created (the
	// store then polls the table until it creates it again).
	Name   string
	Exists bool
	// Active says whether a relay is reading the slot now.
	Active bool
	// RetainedWAL is how many bytes of WAL the slot keeps on the server's disk (from its
	// restart_lsn to the current position); Lag how many bytes its confirmed position is
	// behind the current one.
	RetainedWAL, Lag int64
	// WALStatus is the server's view of the slot's WAL: reserved, extended, unreserved or
	// lost (pg_replication_slots.wal_status).
	WALStatus string
	// Mode is what the store in this process does: "stream" (sends what the log names),
	// "poll" (claims from the table, as after a start or a failure), "standby" (another
	// relay holds the slot); empty when read from outside a relay (outbox status).
	Mode string
}
