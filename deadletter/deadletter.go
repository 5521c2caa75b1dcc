// Package deadletter is the dead-letter table shared by the relay and the consumers: events
// that could not be delivered (stage "relay") or handled (stage "consumer"), with the reason,
// the attempt count and when they failed. People list them, look at one, replay it — back
// through the outbox, in one transaction with the status change — or discard it (the row is
// kept for audit). It is for application developers (the [Notice], [Kind] and [Stage] an
// OnDeadLetter hook receives; the [Table] an adapter's NewDeadLetters returns) and for
// operators' tools (the `outbox dead-letters` command and the console use it).
//
// Each SQL adapter opens the table of its outbox: outboxpgx.Default.NewDeadLetters(pool),
// outboxsql.Postgres.NewDeadLetters(db)…; they all return a [Table].
//
// A dead letter is stored whatever its content. Text the database would refuse is made
// storable — invalid UTF-8 becomes U+FFFD, NUL bytes are dropped, values longer than their
// column are cut (with a trailing "…") — and the entry as it came is kept in the table's
// raw column ([Entry.Raw]), so nothing is lost. A message the consumer could not read at
// all (an [outbox.MalformedError]) keeps its body and attributes as received there too.
//
// A keyed event that the relay dead-letters holds its key by default (relay.Config.KeyPolicy
// HoldKey): the key's later events wait until the entry is replayed — the event goes first,
// then the others follow — or discarded — the key moves on ([Entry.HeldSeq]). Held keys
// show in Stats.HeldKeys, `outbox status`, the console and the txoutbox.outbox.held_keys
// gauge.
package deadletter

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"

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

// Kind classifies why an event became a dead letter.
type Kind string

// Kinds. Entries written before the table had the column (migration 3) were classified
// by their reasons where these were recognisable, and have Kind "" otherwise.
const (
	// KindGaveUp: delivery (relay) or handling (consumer) failed MaxAttempts times, or the
	// relay lost its lease while sending that often.
	KindGaveUp Kind = "gave-up"
	// KindPermanent: the Sender or the handler returned an [outbox.Permanent] error, or the
	// handler panicked.
	KindPermanent Kind = "permanent"
	// KindTooLarge: the message is over the broker's size limit ([outbox.ErrTooLarge]).
	KindTooLarge Kind = "too-large"
	// KindUnreadableRow: the relay could not read the outbox row (written by raw SQL or
	// another producer); Raw holds its columns as they were.
	KindUnreadableRow Kind = "unreadable-row"
	// KindMalformed: the broker message is not a valid event ([outbox.ErrMalformed]); Raw
	// holds its attributes and body as received and BrokerMessageID names it.
	KindMalformed Kind = "malformed"
	// KindUnknownType: the consumer has no handler for the event type.
	KindUnknownType Kind = "unknown-type"
	// KindUndecodable: the body does not decode into the handler's payload type.
	KindUndecodable Kind = "undecodable"
	// KindHeld: a consumer that holds keys (consumer.Config.HoldKeys) did not handle the
	// event because an earlier event of its key is a pending dead letter of that consumer,
	// or is being replayed; the reason names that entry. Replay it after the entry that
	// holds the key, as [KeyHolds] describes.
	KindHeld Kind = "held"
	// KindBlobMissing: the event travelled as a claim check (a CloudEvents dataref naming
	// a blob, see package claimcheck) and the blob was not in the consumer's blob store:
	// removed before the event was handled (a retention shorter than the redelivery
	// horizon), never written, or named outside the store. Message holds the reference,
	// not the body.
	KindBlobMissing Kind = "blob-missing"
)

// Classified is an error that names its dead-letter kind. A handler error that is
// [outbox.Permanent] and wraps one is dead-lettered with that kind instead of
// [KindPermanent] (claimcheck's missing blob is [KindBlobMissing]).
type Classified interface {
	error
	DeadLetterKind() Kind
}

// Entry is one dead letter.
type Entry struct {
	ID int64 // the dead letter's own ID
	// Message is the event. Its ID is uuid.Nil when none could be read (a malformed
	// message, an outbox row whose id is not a UUID): the table stores NULL, never a
	// made-up ID. Its text fields are as stored, made storable if they had to be (see Raw).
	Message outbox.Message
	// Stage is where it failed: the relay (sending) or a consumer (handling).
	Stage Stage
	// Kind is what went wrong, when it was not the handler's or the broker's error.
	Kind Kind
	// Consumer is the consumer's name, for StageConsumer.
	Consumer string
	// Reason is the last error, as text.
	Reason string
	// Attempts is how many times delivery or handling was tried.
	Attempts int
	// BrokerMessageID is the broker's own identity of the message (SQS MessageId, Azure
	// Queue message ID, JetStream sequence…), set by the consumer for malformed messages.
	BrokerMessageID string
	// Raw is the entry as it came, kept when something had to change to store it or when
	// the message was malformed; nil otherwise. Writers set Raw (Attributes, Body) to keep
	// evidence the other fields cannot hold; the table fills in the rest. A raw column that
	// no longer parses (edited by hand) comes back whole in Raw.Body.
	Raw *Raw

	// HeldSeq is the outbox row this dead letter holds, 0 if none: a keyed event that the
	// relay dead-lettered under KeyPolicy HoldKey (the default) stays in the outbox, never
	// claimed, as the first row of its key, and the key's later events wait behind it.
	// [Table.Replay] makes that row deliverable again where it stands, so it goes first;
	// [Table.Discard] deletes it, and the key moves on. Only the relay's write-back sets it
	// ([Writer.Add] ignores it).
	HeldSeq int64

	// FirstFailedAt and LastFailedAt are the first and the last failure, by the
	// database's clock.
	FirstFailedAt time.Time
	LastFailedAt  time.Time
	// Status is pending until the entry is replayed or discarded.
	Status Status
	// StatusChangedAt is when Status last changed; zero while pending.
	StatusChangedAt time.Time
}

// Filter selects dead letters for [Table.List]. Zero fields match everything.
type Filter struct {
	// Status, Stage and Kind match entries with that value.
	Status Status
	Stage  Stage
	Kind   Kind
	// Consumer matches one consumer's entries.
	Consumer string
	// EventType matches one event type (Message.Type).
	EventType string
	// EventID matches one event's entries (an event can fail more than once, e.g. after a
	// replay).
	EventID uuid.UUID
	// BrokerMessageID finds a malformed message by the broker's ID for it.
	BrokerMessageID string
	// ReasonContains matches reasons that contain it (case-sensitive).
	ReasonContains string
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

// ErrNotReplayable is returned when replaying an entry that cannot be rebuilt into the
// event it was: a malformed message or an unreadable outbox row (their envelope was never
// read in full), an entry without an event ID, or one whose event had to be changed to be
// stored. Its Raw still holds the original for a person to repair and publish.
var ErrNotReplayable = errors.New("deadletter: entry cannot be replayed as an event")

// Writer adds dead letters; the consumer runtime writes through it.
type Writer interface {
	Add(ctx context.Context, e Entry) error
}

// KeyHolds is an optional interface of a [Table], which every adapter's table has: a
// consumer that holds keys (consumer.Config.HoldKeys) asks it, for each keyed delivery,
// whether an earlier event of the key stands in the table ahead of it.
//
// HeldBy returns the ID of the consumer-stage entry of consumer that holds key ahead of
// event (published at the event's CreatedAt), or 0 when the event may be handled. Entries
// of that consumer and key decide, by their IDs, which is the order in which the consumer
// dead-lettered them, i.e. the key's order:
//
//   - An event with no replayed entry (a new event) is held by the key's oldest pending
//     entry. With none pending, it is still held by a replayed entry whose event was
//     published before it and which was replayed after it was published: the event
//     reached the broker while the key was held, the replayed events come behind it, and
//     it must go after them.
//   - An event that was replayed takes the place of its first entry: it is held only by
//     a pending entry older than that place, or by a pending entry of an event whose own
//     place is older (an earlier event that failed again after its replay).
//
// So the key's pending entries can be replayed in any order, one at a time or all at
// once: an event that comes back before the events ahead of it is held again, keeping its
// place, and the key is released once every entry is replayed or discarded. The times
// compare the producer's clock (CreatedAt) with the database's (the replay), so clocks
// should agree to well under the time between a key's events.
type KeyHolds interface {
	HeldBy(ctx context.Context, consumer, key string, event uuid.UUID, published time.Time) (int64, error)
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
	// one transaction. An entry that holds its key (HeldSeq) makes its held row deliverable
	// again where it stands: the key's first row, so it is delivered before the key's later
	// events, which then follow. Any other entry's event is inserted anew, after whatever
	// the outbox holds. It fails with [ErrNotReplayable] for an entry that cannot be rebuilt
	// into its event (for a held row: one the relay could not read).
	Replay(ctx context.Context, id int64) error
	// Discard marks a pending entry discarded; the entry stays for audit. An entry that
	// holds its key (HeldSeq) deletes its held row in the same transaction: the key's later
	// events go on.
	Discard(ctx context.Context, id int64) error
	// Prune deletes up to limit entries that were replayed or discarded more than
	// retention ago (by the database clock), and returns how many it deleted. Pending
	// entries are never deleted. Call it from one instance until it returns less than
	// limit.
	Prune(ctx context.Context, retention time.Duration, limit int) (int64, error)
}
