package idempotency_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/consumer"
	"github.com/txoutbox/outbox/idempotency"
)

func TestEventKey(t *testing.T) {
	id := uuid.Must(uuid.NewV7())
	ctx := consumer.WithInfo(context.Background(), consumer.Info{Consumer: "billing", Attempt: 1})
	if k, err := idempotency.EventKey(ctx, id); err != nil || k != (idempotency.Key{Consumer: "billing", EventID: id}) {
		t.Fatalf("EventKey = %v, %v", k, err)
	}
	if _, err := idempotency.EventKey(context.Background(), id); err == nil || !outbox.IsPermanent(err) {
		t.Fatalf("EventKey without a consumer name: %v, want a permanent error", err)
	}
}

// TestRequestKey: a request key is stable, separates scopes from each other and from
// consumers, and its ID is a UUIDv5 (never an event's UUIDv7).
func TestRequestKey(t *testing.T) {
	a := idempotency.RequestKey("acme", "k-1")
	if a != idempotency.RequestKey("acme", "k-1") {
		t.Fatal("RequestKey is not stable")
	}
	if a.Consumer != "http:acme" || a.EventID.Version() != 5 {
		t.Fatalf("RequestKey = %+v, want consumer http:acme and a UUIDv5", a)
	}
	if b := idempotency.RequestKey("globex", "k-1"); b.Consumer == a.Consumer {
		t.Fatal("two scopes share a key")
	}
	if c := idempotency.RequestKey("acme", "k-2"); c.EventID == a.EventID {
		t.Fatal("two keys share an ID")
	}
}
