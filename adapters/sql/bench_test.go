package outboxsql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/txoutbox/outbox"
	outboxsql "github.com/txoutbox/outbox/adapters/sql"
	"github.com/txoutbox/outbox/internal/benchtest"
	"github.com/txoutbox/outbox/internal/sqlstore/sqlstoretest"
)

type benchOrder struct {
	ID    int64 `json:"id"`
	Total int64 `json:"total"`
}

func (benchOrder) EventType() string { return "bench.order_placed" }

// BenchmarkProducer compares, on PostgreSQL through pgx's stdlib driver with 8 clients, one
// business INSERT per BeginTx transaction alone, with a hand-written outbox INSERT, and
// with Publish, in interleaved rounds. publish/raw_outbox is Publish's throughput relative
// to the hand-written INSERT (DESIGN §11 target ≥ 0.95), publish/business relative to the
// business transaction alone (≥ 0.8).
//
//	go test -run '^$' -bench Producer -benchtime 1x ./adapters/sql
func BenchmarkProducer(b *testing.B) {
	ctx := context.Background()
	o := newTestOutbox(b, "postgres", outboxsql.Postgres, "pgx")
	orders := o.Table("orders")
	if _, err := o.DB.ExecContext(ctx, "CREATE TABLE "+orders+" (id bigserial PRIMARY KEY, total bigint NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	o.DB.SetMaxIdleConns(16)
	business := "INSERT INTO " + orders + " (total) VALUES ($1)"
	raw := "INSERT INTO " + o.OutboxTable() + " (id, type, key, headers, content_type, body, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)"
	tx := func(body func(ctx context.Context, tx *sql.Tx) error) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			tx, err := o.DB.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(ctx, business, 42); err != nil {
				return err
			}
			if err := body(ctx, tx); err != nil {
				return err
			}
			return tx.Commit()
		}
	}
	sqlstoretest.CompareProducers(b, 8, time.Second, 5,
		sqlstoretest.Variant{Name: "business", Tx: tx(func(context.Context, *sql.Tx) error { return nil })},
		sqlstoretest.Variant{Name: "raw_outbox", Tx: tx(func(ctx context.Context, tx *sql.Tx) error {
			id, _ := uuid.NewV7()
			_, err := tx.ExecContext(ctx, raw, id.String(), "bench.order_placed", "", nil, "application/json", []byte(`{"id":1,"total":42}`), time.Now())
			return err
		})},
		sqlstoretest.Variant{Name: "publish", Tx: tx(func(ctx context.Context, tx *sql.Tx) error {
			return o.Publish(ctx, tx, outbox.New(benchOrder{1, 42}))
		})},
	)
}

// BenchmarkRelayDrainKeys is adapters/pgx's BenchmarkRelayDrainKeys on MySQL/MariaDB and
// SQLite through database/sql: a 100k backlog with 1 to 100k distinct keys, drained by a
// relay with the default config into a transport that accepts everything, each rate as a
// ratio to a keyless one drained just before it. A drain is cut short after a minute.
//
//	go test -run '^$' -bench RelayDrainKeys -benchtime 1x ./adapters/sql
func BenchmarkRelayDrainKeys(b *testing.B) {
	const n = 100000
	for _, d := range dialects {
		if d.name == "postgres" { // adapters/pgx measures PostgreSQL
			continue
		}
		b.Run(d.name, func(b *testing.B) {
			benchtest.DrainKeys(b, n, func(b *testing.B, key func(int) string) float64 {
				o := newTestOutbox(b, d.name, d.dialect, d.driver)
				ctx := context.Background()
				events := make([]outbox.Encodable, 0, 1000)
				for i := range n {
					events = append(events, outbox.New(benchOrder{int64(i), 42}, outbox.WithKey(key(i))))
					if len(events) == cap(events) || i == n-1 {
						if err := o.publish(ctx, true, events...); err != nil {
							b.Fatal(err)
						}
						events = events[:0]
					}
				}
				return benchtest.DrainRelay(b, o.store(b), n, nil, time.Minute)
			})
		})
	}
}
