package outboxsql_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/sqlstore"
)

// TestDriverErrorsAreClassified: the errors of every driver the adapters are tested with
// mean what sqlstore.Classify says — a schema to migrate, a database that is unavailable,
// or neither (the statement's own problem) — also when wrapped.
func TestDriverErrorsAreClassified(t *testing.T) {
	names, err := sqlstore.NewNames(sqlstore.Postgres, outbox.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	sqliteDB, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "x.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer sqliteDB.Close()
	_, noTable := sqliteDB.Exec("INSERT INTO missing (a) VALUES (1)")
	_, noFunction := sqliteDB.Exec("SELECT no_such_function(1)")
	_, syntax := sqliteDB.Exec("SELEKT 1")
	pgDown := func() error {
		c, err := pgconn.Connect(context.Background(), "postgres://postgres@127.0.0.1:1/test?connect_timeout=5")
		if c != nil {
			c.Close(context.Background())
		}
		return err
	}()

	const (
		schema      = "schema"
		unavailable = "unavailable"
		other       = "other"
	)
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"postgres undefined_table", &pgconn.PgError{Code: "42P01"}, schema},
		{"postgres undefined_function", &pgconn.PgError{Code: "42883"}, schema},
		{"postgres undefined_column", &pgconn.PgError{Code: "42703"}, schema},
		{"postgres invalid_schema_name", &pgconn.PgError{Code: "3F000"}, schema},
		{"postgres admin_shutdown", &pgconn.PgError{Code: "57P01"}, unavailable},
		{"postgres cannot_connect_now", &pgconn.PgError{Code: "57P03"}, unavailable},
		{"postgres too_many_connections", &pgconn.PgError{Code: "53300"}, unavailable},
		{"postgres connection_failure", &pgconn.PgError{Code: "08006"}, unavailable},
		{"postgres unique_violation", &pgconn.PgError{Code: "23505"}, other},
		{"postgres connect refused", pgDown, unavailable},
		{"mysql no such table", &mysql.MySQLError{Number: 1146}, schema},
		{"mysql unknown column", &mysql.MySQLError{Number: 1054}, schema},
		{"mysql too many connections", &mysql.MySQLError{Number: 1040}, unavailable},
		{"mysql server shutdown", &mysql.MySQLError{Number: 1053}, unavailable},
		{"mariadb connection killed", &mysql.MySQLError{Number: 1927}, unavailable},
		{"mysql duplicate entry", &mysql.MySQLError{Number: 1062}, other},
		{"mysql invalid connection", mysql.ErrInvalidConn, unavailable},
		{"database/sql bad connection", driver.ErrBadConn, unavailable},
		{"database/sql connection done", sql.ErrConnDone, unavailable},
		{"sqlite no such table", noTable, schema},
		{"sqlite no such function", noFunction, schema},
		{"sqlite syntax error", syntax, other},
		{"cancelled", context.Canceled, other},
		{"plain", errors.New("boom"), other},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.err == nil {
				t.Fatal("no error to classify")
			}
			for _, err := range []error{c.err, fmt.Errorf("wrapped: %w", c.err), errors.Join(errors.New("rollback"), c.err)} {
				got := sqlstore.Classify(err, names)
				kind := other
				switch {
				case errors.Is(got, outbox.ErrSchema):
					kind = schema
				case outbox.IsUnavailable(got):
					kind = unavailable
				}
				if kind != c.want {
					t.Errorf("Classify(%v) is %s, want %s", err, kind, c.want)
				}
				if kind == schema && !errors.Is(got, c.err) {
					t.Errorf("Classify(%v) lost the driver's error", err)
				}
			}
		})
	}
}
