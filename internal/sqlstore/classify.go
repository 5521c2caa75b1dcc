package sqlstore

import (
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/txoutbox/outbox"
)

// This file tells what a database's error means for the message at hand: a schema that is
// missing or old (outbox.ErrSchema: run Migrate), a database that cannot be reached or
// refuses service (outbox.Unavailable: not the message's fault), or anything else. The
// core module imports no driver, so errors are recognised by the methods their types have
// (pgconn's and lib/pq's SQLState, bun's pgdriver Field, modernc's and glebarez's SQLite
// Code), by reflection where a driver offers no method (go-sql-driver's MySQLError.Number,
// pgconn's ConnectError), and by the texts of the drivers' sentinel errors. Only errors are
// classified, so a statement that succeeds costs nothing more.

// Classify marks err, an error of a statement on n's tables, for what it means: wrapping
// outbox.ErrSchema when a table, column, function or schema it uses does not exist (the
// outbox is not migrated, or by an older version), outbox.Unavailable when the database
// could not be reached or refused service. Other errors, and errors already marked, are
// returned as they are; nil stays nil.
func Classify(err error, n *Names) error {
	switch {
	case err == nil, errors.Is(err, outbox.ErrSchema), errors.Is(err, outbox.ErrUnavailable):
		return err
	case schemaMissing(err):
		return fmt.Errorf("%w: %s: %w", outbox.ErrSchema, n.Outbox, err)
	case databaseUnavailable(err):
		return outbox.Unavailable(err)
	}
	return err
}

// classifyUnavailable marks err with outbox.Unavailable when it says that the database could
// not be reached or refused service; other errors are returned as they are. It is Classify
// for errors that may be the caller's own (a handler's statements in a transaction of ours):
// a table of theirs that does not exist is not our schema's problem, but a connection that
// broke is the database's whoever's statement it broke.
func classifyUnavailable(err error) error {
	if err == nil || errors.Is(err, outbox.ErrUnavailable) || !databaseUnavailable(err) {
		return err
	}
	return outbox.Unavailable(err)
}

// schemaMissing reports whether err says that a table, column, function or schema does not
// exist.
func schemaMissing(err error) bool {
	found := false
	walk(err, func(e error) bool {
		if state, ok := sqlState(e); ok {
			switch state {
			case "42P01", // undefined_table
				"42883", // undefined_function
				"42703", // undefined_column: a table of an older version
				"3F000": // invalid_schema_name
				found = true
			}
			return true
		}
		if num, ok := mysqlNumber(e); ok {
			switch num {
			case 1146, // ER_NO_SUCH_TABLE
				1049, // ER_BAD_DB_ERROR: the database (our schema) does not exist
				1054, // ER_BAD_FIELD_ERROR: a column of a newer version is missing
				1305: // ER_SP_DOES_NOT_EXIST
				found = true
			}
			return true
		}
		if _, ok := sqliteCode(e); ok {
			msg := e.Error()
			found = strings.Contains(msg, "no such table") || strings.Contains(msg, "no such column") ||
				strings.Contains(msg, "no such function")
			return true
		}
		return false
	})
	return found
}

// databaseUnavailable reports whether err says that the database could not be reached, the
// connection broke or closed under the statement, or the server refused service (shutting
// down, starting, too many connections, read-only after a failover).
func databaseUnavailable(err error) bool {
	if outbox.IsUnavailable(err) || // network errors: refused, reset, unreachable, DNS, I/O timeouts, TLS
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return true
	}
	found := false
	walk(err, func(e error) bool {
		if state, ok := sqlState(e); ok {
			found = strings.HasPrefix(state, "08") || // connection_exception
				state == "57P01" || // admin_shutdown (pg_terminate_backend, a fast shutdown)
				state == "57P02" || // crash_shutdown
				state == "57P03" || // cannot_connect_now (starting up, shutting down, recovering)
				state == "53300" || // too_many_connections
				state == "25006" // read_only_sql_transaction: a standby after a failover
			return true
		}
		if num, ok := mysqlNumber(e); ok {
			switch num {
			case 1040, // ER_CON_COUNT_ERROR: too many connections
				1045,                   // ER_ACCESS_DENIED_ERROR: the server refused the login
				1053,                   // ER_SERVER_SHUTDOWN
				1152,                   // ER_ABORTING_CONNECTION
				1158, 1159, 1160, 1161, // ER_NET_*: reading or writing the connection failed
				1203,                   // ER_TOO_MANY_USER_CONNECTIONS
				1836,                   // ER_READ_ONLY_MODE
				1927,                   // ER_CONNECTION_KILLED (MariaDB)
				2002, 2003, 2006, 2013: // client: cannot connect, server gone away, lost during query
				found = true
			}
			return true
		}
		if code, ok := sqliteCode(e); ok {
			switch code & 0xff { // the primary result code of an extended one
			case 5, // SQLITE_BUSY: the writer's lock was not free within the busy timeout
				6,  // SQLITE_LOCKED
				10, // SQLITE_IOERR
				13, // SQLITE_FULL
				14: // SQLITE_CANTOPEN
				found = true
			}
			return true
		}
		if connectError(e) {
			found = true
			return true
		}
		// The drivers' sentinels for a connection they closed, or a pool closed under the
		// call: go-sql-driver's ErrInvalidConn, pgconn's ErrConnClosed, pgxpool's closed
		// pool, database/sql's closed *sql.DB.
		if u, ok := e.(interface{ Unwrap() error }); !ok || u.Unwrap() == nil {
			switch e.Error() {
			case "invalid connection", "conn closed", "closed pool", "sql: database is closed":
				found = true
				return true
			}
		}
		return false
	})
	return found
}

// walk calls visit on err and each error it wraps, depth first, until visit returns true.
func walk(err error, visit func(error) bool) bool {
	if err == nil {
		return false
	}
	if visit(err) {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return walk(u.Unwrap(), visit)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if walk(e, visit) {
				return true
			}
		}
	}
	return false
}

// sqlState returns the SQLSTATE of a PostgreSQL error: pgconn.PgError and lib/pq's Error
// have SQLState(), bun's pgdriver.Error has Field('C').
func sqlState(e error) (string, bool) {
	switch pe := e.(type) {
	case interface{ SQLState() string }:
		return pe.SQLState(), true
	case interface{ Field(byte) string }:
		if s := pe.Field('C'); s != "" {
			return s, true
		}
	}
	return "", false
}

// mysqlNumber returns the error number of go-sql-driver's *mysql.MySQLError, which has no
// method for it (read by reflection: the core module imports no driver).
func mysqlNumber(e error) (uint16, bool) {
	v := reflect.ValueOf(e)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct || v.Elem().Type().Name() != "MySQLError" {
		return 0, false
	}
	f := v.Elem().FieldByName("Number")
	if !f.IsValid() || f.Kind() != reflect.Uint16 {
		return 0, false
	}
	return uint16(f.Uint()), true
}

// sqliteCode returns the result code of an SQLite error of modernc.org/sqlite or its forks
// (glebarez/go-sqlite): their *sqlite.Error has Code().
func sqliteCode(e error) (int, bool) {
	c, ok := e.(interface{ Code() int })
	if !ok || !strings.HasSuffix(reflect.TypeOf(e).String(), "sqlite.Error") {
		return 0, false
	}
	return c.Code(), true
}

// connectError reports whether e is pgconn's *ConnectError: a connection attempt failed
// (refused, authentication, TLS, a server that is starting).
func connectError(e error) bool {
	t := reflect.TypeOf(e)
	return t.Kind() == reflect.Pointer && t.Elem().Name() == "ConnectError" && strings.HasSuffix(t.Elem().PkgPath(), "/pgconn")
}
