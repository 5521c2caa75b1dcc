package outboxtest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/txoutbox/outbox"
)

// MigrateFixture is one fresh, unmigrated outbox of the adapter under test, whose
// transactions are of type TTx, and the adapter's Migrate and MigrateTx over it.
type MigrateFixture[TTx any] struct {
	// Migrate is the adapter's Migrate.
	Migrate func(ctx context.Context) error
	// MigrateTx is the adapter's MigrateTx inside tx.
	MigrateTx func(ctx context.Context, tx TTx) error
	// Validate is the adapter's Validate.
	Validate func(ctx context.Context) error
	// InTx runs fn in a transaction of the adapter's kind, committed when fn returns nil.
	InTx func(ctx context.Context, fn func(tx TTx) error) error
	// Migrated reports whether the outbox's tables exist, and how many migrations are
	// recorded.
	Migrated func(ctx context.Context) (exists bool, versions int, err error)
	// Versions is how many migrations the dialect has.
	Versions int
	// DDLCommits says the database commits DDL (MySQL): MigrateTx must refuse.
	DDLCommits bool
}

// ExerciseMigrate runs the migration suite: Migrate is idempotent and safe to run
// concurrently; MigrateTx migrates inside the caller's transaction, or refuses where DDL
// would commit it; Validate fails with outbox.ErrSchema until the outbox is migrated.
func ExerciseMigrate[TTx any](t *testing.T, newFixture func(t *testing.T) *MigrateFixture[TTx]) {
	t.Helper()
	ctx := context.Background()
	t.Run("ConcurrentAndIdempotent", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		if err := f.Validate(ctx); !errors.Is(err, outbox.ErrSchema) || !strings.Contains(err.Error(), "migration 1 (outbox) is not applied") {
			t.Fatalf("Validate before Migrate: %v, want outbox.ErrSchema naming migration 1", err)
		}
		errs := make(chan error, 3)
		for range 3 {
			go func() { errs <- f.Migrate(ctx) }()
		}
		for range 3 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Migrate(ctx); err != nil {
			t.Fatalf("migrating again: %v", err)
		}
		if exists, versions, err := f.Migrated(ctx); err != nil || !exists || versions != f.Versions {
			t.Fatalf("after Migrate: tables %v, %d migrations recorded (%v); want %d", exists, versions, err, f.Versions)
		}
		if err := f.Validate(ctx); err != nil {
			t.Fatalf("Validate after Migrate: %v", err)
		}
	})
	t.Run("MigrateTx", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		rollback := errors.New("rolled back on purpose")
		err := f.InTx(ctx, func(tx TTx) error {
			if err := f.MigrateTx(ctx, tx); err != nil {
				return err
			}
			return rollback
		})
		if f.DDLCommits {
			if err == nil || errors.Is(err, rollback) {
				t.Fatalf("MigrateTx where DDL commits: %v, want a refusal", err)
			}
			if exists, _, _ := f.Migrated(ctx); exists {
				t.Fatal("MigrateTx refused, but created the tables")
			}
			return
		}
		if !errors.Is(err, rollback) {
			t.Fatalf("MigrateTx: %v", err)
		}
		if exists, _, _ := f.Migrated(ctx); exists {
			t.Fatal("the outbox exists after MigrateTx's transaction rolled back")
		}
		if err := f.InTx(ctx, func(tx TTx) error { return f.MigrateTx(ctx, tx) }); err != nil {
			t.Fatal(err)
		}
		if exists, versions, err := f.Migrated(ctx); err != nil || !exists || versions != f.Versions {
			t.Fatalf("after a committed MigrateTx: tables %v, %d migrations (%v); want %d", exists, versions, err, f.Versions)
		}
	})
}
