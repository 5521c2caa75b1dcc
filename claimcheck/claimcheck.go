// Package claimcheck carries events of any size over brokers with a size limit (Azure Queue
// Storage 64 KiB, SQS 256 KiB, NATS and Kafka 1 MiB by default): the claim-check pattern. It
// is for application developers whose payloads can outgrow their broker, and for authors of
// blob stores ([BlobStore]: S3 and Azure Blob Storage have modules of their own, [Dir] is a
// directory).
//
// On the relay's side, [NewSender] wraps the transport's Sender: a message whose body is over
// the threshold, or that the transport refuses as too large ([outbox.ErrTooLarge]), has its
// body put in the blob store under a key derived from its event ID ([Key]), and travels with
// an empty body and the blob's URI in the CloudEvents "dataref" extension ([Header]). A
// re-send writes the same blob again, so retries never leave copies behind.
//
// On the consumer's side, [Resolve] is a consumer.Middleware: it fetches the body named by
// the dataref before the handler decodes the event, so typed handlers and the adapters'
// Idempotent handlers see the event as it was published. A blob that is not there is a dead
// letter of kind [deadletter.KindBlobMissing], never a crash or a retry loop; a blob store
// that cannot be reached pauses the consumer as any unavailable dependency does.
//
// # Clean-up
//
// Blobs are removed by age: [Sweep] deletes the blobs last written before a cutoff, and a
// process runs it now and then with cutoff = now − retention (S3 and Azure lifecycle rules
// do the same job in production without a process; see docs/claimcheck.md). The relay writes
// a message's blob again at each send, so a blob's age is the time since the last send that
// referenced it. The retention must therefore exceed how long a sent message can wait in the
// broker before it is handled for the last time: the broker's own message retention (SQS's
// MessageRetentionPeriod, the queue message's time to live, a stream's max age) or, when
// that is longer, the consumers' longest redelivery horizon (MaxAttempts × MaxRetryBackoff)
// plus the longest outage they should ride out. A dead letter of a claim-checked event keeps
// the reference, not the body: replay it within the retention.
//
// Bodies are never logged, by this package or by the consumer; errors name the event ID and
// the blob's URI only.
package claimcheck

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Header is the message header (the CloudEvents "dataref" extension attribute, binary mode
// "ce-dataref") that carries the URI of a claim-checked body.
const Header = "dataref"

// ErrNotFound is wrapped by [BlobStore.Get] when the blob does not exist.
var ErrNotFound = errors.New("claimcheck: blob not found")

// BlobStore keeps the bodies of claim-checked messages. Implement it for a store of your
// own (Google Cloud Storage…) and check it with outboxtest.ExerciseBlobStore.
//
// Keys are what [Key] returns: letters, digits and "-", at most 64 bytes; a store may prefix
// them. Every method is safe for concurrent use and honours ctx.
type BlobStore interface {
	// Put writes body under key, replacing any blob there (and so renewing its age).
	Put(ctx context.Context, key string, body []byte) error
	// Get returns the blob under key, or an error wrapping [ErrNotFound].
	Get(ctx context.Context, key string) ([]byte, error)
	// Delete removes the blob under key; a missing blob is not an error.
	Delete(ctx context.Context, key string) error
	// List calls yield for each blob of the store, in no particular order, until yield
	// returns false.
	List(ctx context.Context, yield func(Blob) bool) error
	// Ref returns the URI of the blob under key, which travels as the dataref. It is
	// Ref("") followed by key, so that a consumer can tell its store's references.
	Ref(key string) string
}

// Blob describes a stored blob.
type Blob struct {
	Key      string
	Size     int64
	Modified time.Time // when it was last written, by the store's clock
}

// Key returns the blob key of the event with the given ID: its UUID in hyphenated form. A
// re-sent or replayed event has the same ID, so its body goes to the same blob.
func Key(id uuid.UUID) string { return id.String() }

// ValidKey reports whether key is a blob key this package writes: 1 to 64 bytes of ASCII
// letters, digits and "-". Stores may accept more; they must accept these.
func ValidKey(key string) error {
	if key == "" || len(key) > 64 {
		return fmt.Errorf("claimcheck: blob key %q: want 1 to 64 bytes", key)
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
			return fmt.Errorf("claimcheck: blob key %q: byte %d is not a letter, a digit or '-'", key, i)
		}
	}
	return nil
}

// Sweep deletes the blobs of store last written before cutoff and returns how many it
// deleted. Call it now and then (an hour is fine) with cutoff = time.Now().Add(-retention),
// where retention is as the package documentation's "Clean-up" says; several processes may
// sweep the same store. It stops at ctx's end or at the first error.
func Sweep(ctx context.Context, store BlobStore, cutoff time.Time) (int, error) {
	var old []string
	err := store.List(ctx, func(b Blob) bool {
		if b.Modified.Before(cutoff) {
			old = append(old, b.Key)
		}
		return ctx.Err() == nil
	})
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return 0, fmt.Errorf("claimcheck: sweep: listing blobs: %w", err)
	}
	for i, key := range old {
		if err := store.Delete(ctx, key); err != nil {
			return i, fmt.Errorf("claimcheck: sweep: deleting blob %s: %w", key, err)
		}
	}
	return len(old), nil
}
