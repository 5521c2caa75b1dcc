package outboxpgx_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/adapters/pgx/pgxtest"
	"github.com/txoutbox/outbox/internal/sqlstore"
	"github.com/txoutbox/outbox/outboxtest"
)

// TestMigrate runs the migration suite on an Outbox at a schema of its own, which Migrate
// creates, and on outboxpgx.Default (the default names, on a pool whose search_path is the
// test's schema).
func TestMigrate(t *testing.T) {
	for _, defaults := range []bool{false, true} {
		name := map[bool]string{false: "Outbox", true: "DefaultNames"}[defaults]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			outboxtest.ExerciseMigrate(t, func(t *testing.T) *outboxtest.MigrateFixture[pgx.Tx] {
				ctx := context.Background()
				admin, err := pgxpool.New(ctx, pgxtest.URL())
				if err == nil {
					err = admin.Ping(ctx)
				}
				outboxtest.RequireService(t, "PostgreSQL", err)
				suffix := make([]byte, 6)
				_, _ = rand.Read(suffix)
				schema := "m_" + hex.EncodeToString(suffix)
				t.Cleanup(func() {
					_, _ = admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
					admin.Close()
				})
				o, err := outboxpgx.New(outbox.Tables{Schema: schema})
				if err != nil {
					t.Fatal(err)
				}
				pool := admin
				if defaults {
					o = outboxpgx.Default
					if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
						t.Fatal(err)
					}
					cfg, err := pgxpool.ParseConfig(pgxtest.URL())
					if err != nil {
						t.Fatal(err)
					}
					cfg.ConnConfig.RuntimeParams["search_path"] = schema
					if pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(pool.Close)
				}
				f := &outboxtest.MigrateFixture[pgx.Tx]{
					Migrate:   func(ctx context.Context) error { return o.Migrate(ctx, pool) },
					MigrateTx: o.MigrateTx,
					Validate:  func(ctx context.Context) error { return o.Validate(ctx, pool) },
					InTx:      func(ctx context.Context, fn func(pgx.Tx) error) error { return pgx.BeginFunc(ctx, pool, fn) },
					Migrated: func(ctx context.Context) (bool, int, error) {
						var exists bool
						var versions int
						if err := admin.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", schema+".outbox").Scan(&exists); err != nil || !exists {
							return false, 0, err
						}
						err := admin.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox_migrations").Scan(&versions)
						return true, versions, err
					},
					Versions: len(sqlstore.Postgres.Migrations()),
				}
				return f
			})
		})
	}
}
