package sqlstore

import (
	"context"

	"github.com/txoutbox/outbox/outboxdriver"
)

// This file is the relay store every dialect returns: its own store (postgres_store.go,
// mysql_store.go, sqlite_store.go), with errors classified and the schema validated.

// relayStore is what each dialect's relay store implements.
type relayStore interface {
	outboxdriver.Store
	outboxdriver.StatsReader
}

// loopOf returns the relay loop's state of type T kept in s (outboxdriver.ClaimParams.State:
// pgLoop, mysqlLoop), creating it on the loop's first claim; a claim without a state (nil)
// gets a fresh one, as a loop's first claim.
func loopOf[T any](s *outboxdriver.ClaimState) *T {
	if s == nil {
		return new(T)
	}
	l, ok := s.Store.(*T)
	if !ok {
		l = new(T)
		s.Store = l
	}
	return l
}

// classifiedStore is a dialect's relay store whose errors are classified (see Classify),
// and which validates its schema for Relay.Run (outboxdriver.Validator).
type classifiedStore struct {
	s   relayStore
	d   Dialect
	db  DB
	n   *Names
	due dueMover // moves scheduled events into the outbox when they fall due
}

var (
	_ outboxdriver.Validator   = (*classifiedStore)(nil)
	_ outboxdriver.StatsReader = (*classifiedStore)(nil)
)

// classified returns s with its errors classified, as d's store over db.
func classified(d Dialect, db DB, n *Names, s relayStore) outboxdriver.Store {
	return &classifiedStore{s: s, d: d, db: db, n: n}
}

func (c *classifiedStore) Claim(ctx context.Context, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, error) {
	if err := c.due.move(ctx, c.d, c.db, c.n); err != nil {
		return nil, Classify(err, c.n)
	}
	claimed, err := c.s.Claim(ctx, p)
	if err != nil {
		return nil, Classify(err, c.n)
	}
	return claimed, nil
}

func (c *classifiedStore) Complete(ctx context.Context, token int64, seqs []int64) error {
	if err := c.s.Complete(ctx, token, seqs); err != nil {
		return Classify(err, c.n)
	}
	return nil
}

func (c *classifiedStore) Retry(ctx context.Context, token int64, retries []outboxdriver.Retry) error {
	if err := c.s.Retry(ctx, token, retries); err != nil {
		return Classify(err, c.n)
	}
	return nil
}

func (c *classifiedStore) DeadLetter(ctx context.Context, token int64, dead []outboxdriver.DeadLetter) ([]int64, error) {
	moved, err := c.s.DeadLetter(ctx, token, dead)
	if err != nil {
		return moved, Classify(err, c.n)
	}
	return moved, nil
}

func (c *classifiedStore) Release(ctx context.Context, token int64, seqs []int64) error {
	if err := c.s.Release(ctx, token, seqs); err != nil {
		return Classify(err, c.n)
	}
	return nil
}

func (c *classifiedStore) Stats(ctx context.Context) (outboxdriver.Stats, error) {
	st, err := c.s.Stats(ctx)
	if err != nil {
		return st, Classify(err, c.n)
	}
	return st, nil
}

// Validate implements outboxdriver.Validator: [Validate] over the store's database.
func (c *classifiedStore) Validate(ctx context.Context) error {
	return Validate(ctx, c.d, c.db, c.n)
}
