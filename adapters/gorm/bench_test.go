package outboxgorm_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/sqlstore/sqlstoretest"
)

// BenchmarkProducer compares, on PostgreSQL (GORM on pgx's stdlib driver) with 8 clients,
// one GORM Create per db.Transaction alone, with a hand-written outbox INSERT through
// tx.Exec, and with Publish, in interleaved rounds. publish/raw_outbox is Publish's
// throughput relative to the hand-written INSERT (DESIGN §11 target ≥ 0.95),
// publish/business relative to the business transaction alone (≥ 0.8).
//
//	go test -run '^$' -bench Producer -benchtime 1x ./adapters/gorm
func BenchmarkProducer(b *testing.B) {
	o := newTestOutbox(b, 0)
	orders := o.Table("orders")
	if err := o.db.Table(orders).AutoMigrate(&Order{}); err != nil {
		b.Fatal(err)
	}
	o.DB.SetMaxIdleConns(16)
	raw := "INSERT INTO " + o.OutboxTable() + " (id, type, key, headers, content_type, body, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
	tx := func(body func(ctx context.Context, tx *gorm.DB) error) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			return o.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				if err := tx.Table(orders).Create(&Order{Total: 42}).Error; err != nil {
					return err
				}
				return body(ctx, tx)
			})
		}
	}
	sqlstoretest.CompareProducers(b, 8, time.Second, 5,
		sqlstoretest.Variant{Name: "business", Tx: tx(func(context.Context, *gorm.DB) error { return nil })},
		sqlstoretest.Variant{Name: "raw_outbox", Tx: tx(func(_ context.Context, tx *gorm.DB) error {
			id, _ := uuid.NewV7()
			return tx.Exec(raw, id.String(), "bench.order_placed", "", nil, "application/json", []byte(`{"order_id":1}`), time.Now()).Error
		})},
		sqlstoretest.Variant{Name: "publish", Tx: tx(func(ctx context.Context, tx *gorm.DB) error {
			return o.Publish(ctx, tx, outbox.New(OrderPlaced{1}))
		})},
	)
}
