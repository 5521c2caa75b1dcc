package outboxbun_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/sqlstore/sqlstoretest"
)

// BenchmarkProducer compares, on PostgreSQL (bun on its pgdriver) with 8 clients, one bun
// insert per db.RunInTx alone, with a hand-written outbox INSERT through tx.ExecContext, and
// with Publish, in interleaved rounds. publish/raw_outbox is Publish's throughput relative
// to the hand-written INSERT (DESIGN §11 target ≥ 0.95), publish/business relative to the
// business transaction alone (≥ 0.8).
//
//	go test -run '^$' -bench Producer -benchtime 1x ./adapters/bun
func BenchmarkProducer(b *testing.B) {
	ctx := context.Background()
	o := newTestOutbox(b, 0)
	orders := o.Table("orders")
	if _, err := o.db.ExecContext(ctx, "CREATE TABLE "+orders+" (id bigserial PRIMARY KEY, total bigint NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	o.DB.SetMaxIdleConns(16)
	raw := "INSERT INTO " + o.OutboxTable() + " (id, type, key, headers, content_type, body, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
	tx := func(body func(ctx context.Context, tx bun.Tx) error) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			return o.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
				if _, err := tx.NewInsert().Model(&Order{Total: 42}).ModelTableExpr(orders).ExcludeColumn("id").Exec(ctx); err != nil {
					return err
				}
				return body(ctx, tx)
			})
		}
	}
	sqlstoretest.CompareProducers(b, 8, time.Second, 5,
		sqlstoretest.Variant{Name: "business", Tx: tx(func(context.Context, bun.Tx) error { return nil })},
		sqlstoretest.Variant{Name: "raw_outbox", Tx: tx(func(ctx context.Context, tx bun.Tx) error {
			id, _ := uuid.NewV7()
			_, err := tx.ExecContext(ctx, raw, id.String(), "bench.order_placed", "", nil, "application/json", []byte(`{"order_id":1}`), time.Now())
			return err
		})},
		sqlstoretest.Variant{Name: "publish", Tx: tx(func(ctx context.Context, tx bun.Tx) error {
			return o.Publish(ctx, tx, outbox.New(OrderPlaced{1}))
		})},
	)
}
