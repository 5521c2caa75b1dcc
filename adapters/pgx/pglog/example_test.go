package outboxpglog_test

import (
	"context"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox/adapters/pgx/pglog"
	"github.com/txoutbox/outbox/relay"
	outboxmemory "github.com/txoutbox/outbox/transports/memory"
)

// A relay that reads the outbox's inserts from PostgreSQL's write-ahead log. The server
// needs wal_level = logical and the pool's role the REPLICATION attribute; the publication
// is created once (here, or by `outbox migrate --log`), the slot by the relay. Run two
// such programs and the second waits as a standby. (Not run as a test: it needs such a
// server; TestKillCrashAndTakeOverLoseNothing and the conformance suite start one.)
func ExampleNewStore() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := outboxpglog.CreatePublication(ctx, pool, nil); err != nil {
		log.Fatal(err)
	}
	store, err := outboxpglog.NewStore(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	r, err := relay.New(store, outboxmemory.New(nil), nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil { // until ctx ends
		log.Fatal(err)
	}
}
