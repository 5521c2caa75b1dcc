package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "modernc.org/sqlite"             // database/sql driver "sqlite", pure Go

	"github.com/txoutbox/outbox"
	outboxsql "github.com/txoutbox/outbox/adapters/sql"
	"github.com/txoutbox/outbox/deadletter"
	"github.com/txoutbox/outbox/internal/sqlstore"
)

// dbFlags are the flags that name an outbox: its database and its tables.
type dbFlags struct {
	url, schema, table string
}

// add registers the flags on fs, with defaults from the environment.
func (f *dbFlags) add(a *app, fs *flag.FlagSet) {
	a.envFlag(fs, &f.url, "database-url", "OUTBOX_DATABASE_URL",
		"the database `URL`: postgres://…, host=… dbname=… (PostgreSQL), mysql://…, sqlite:///path/file.db or a file path")
	a.envFlag(fs, &f.schema, "schema", "OUTBOX_SCHEMA", "the tables' `schema` (MySQL: database); default the connection's")
	a.envFlag(fs, &f.table, "table", "OUTBOX_TABLE", "the outbox `table`, prefix of the others")
}

func (f *dbFlags) tables() outbox.Tables { return outbox.Tables{Schema: f.schema, Outbox: f.table} }

// names validates --schema and --table, each error naming its flag, and returns the
// tables' names in dialect d.
func (f *dbFlags) names(d sqlstore.Dialect) (*sqlstore.Names, error) {
	var errs []error
	if _, err := sqlstore.NewNames(d, outbox.Tables{Schema: f.schema}); err != nil {
		errs = append(errs, fmt.Errorf("--schema: %w", err))
	}
	if _, err := sqlstore.NewNames(d, outbox.Tables{Outbox: f.table}); err != nil {
		errs = append(errs, fmt.Errorf("--table: %w", err))
	}
	if len(errs) > 0 {
		return nil, usageError{errors.Join(errs...)}
	}
	return sqlstore.NewNames(d, f.tables())
}

// target is a parsed database URL.
type target struct {
	dialect sqlstore.Dialect
	driver  string // database/sql driver name
	dsn     string
	shown   string // the URL with its secrets redacted, for messages
	file    string // SQLite: the database file
}

// parseDatabaseURL reads a database URL and records its secrets with r first, so that
// no message about it can print them. PostgreSQL URLs and keyword/value connection strings
// (host=… user=… password=…) go to pgx as they are; mysql://user:pass@host:3306/db?param=v
// becomes the DSN of go-sql-driver/mysql; sqlite:///abs/path.db, sqlite://relative.db and
// plain file paths open SQLite files, with WAL and a busy timeout unless the URL sets its
// own pragmas. Nothing in an error repeats the value: it may hold a password.
func parseDatabaseURL(raw string, r *redactor) (target, error) {
	if raw == "" {
		return target{}, usagef("no database: set OUTBOX_DATABASE_URL or --database-url (postgres://…, mysql://…, sqlite:///path.db)")
	}
	r.addAny(raw)
	if looksLikeKeywords(raw) {
		return target{dialect: sqlstore.Postgres, driver: "pgx", dsn: raw, shown: r.redact("postgres (" + redactKeywords(raw) + ")")}, nil
	}
	scheme, rest, hasScheme := strings.Cut(raw, "://")
	if !hasScheme {
		if user, _, ok := strings.Cut(raw, "@"); ok && strings.Contains(user, ":") {
			return target{}, usagef("--database-url holds user:password@ without a scheme: it is not a file path; write postgres://… or mysql://…")
		}
		scheme, rest = "sqlite", raw
		if strings.HasPrefix(raw, "file:") {
			rest = strings.TrimPrefix(raw, "file:")
		}
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		u, err := parseURL(raw)
		if err != nil {
			return target{}, usagef("--database-url: %v", err)
		}
		return target{dialect: sqlstore.Postgres, driver: "pgx", dsn: raw, shown: r.redact(redactURL(u))}, nil
	case "mysql", "mariadb":
		u, err := parseURL(raw)
		if err != nil {
			return target{}, usagef("--database-url: %v", err)
		}
		shown := r.redact(redactURL(u))
		cfg := mysql.NewConfig()
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
		cfg.Net, cfg.Addr = "tcp", u.Host
		if u.Port() == "" {
			cfg.Addr = net.JoinHostPort(u.Hostname(), "3306")
		}
		cfg.DBName = strings.TrimPrefix(u.Path, "/")
		// Our own settings first; the URL's query may set any of the driver's parameters.
		dsn := cfg.FormatDSN()
		if u.RawQuery != "" {
			sep := "?"
			if strings.Contains(dsn, "?") {
				sep = "&"
			}
			dsn += sep + u.RawQuery
		}
		if _, err := mysql.ParseDSN(dsn); err != nil {
			return target{}, usagef("--database-url: %s: %v", shown, r.hide(err))
		}
		return target{dialect: sqlstore.MySQL, driver: "mysql", dsn: dsn, shown: shown}, nil
	case "sqlite", "sqlite3", "file":
		path, query, _ := strings.Cut(rest, "?")
		if path == "" {
			return target{}, usagef("--database-url names no SQLite file")
		}
		if path == ":memory:" {
			return target{}, usagef("--database-url: an in-memory SQLite database is empty for every connection; name a file")
		}
		q, err := url.ParseQuery(query)
		if err != nil {
			return target{}, usagef("--database-url: the SQLite parameters do not parse: %v", r.hide(err))
		}
		if _, ok := q["_pragma"]; !ok {
			q.Add("_pragma", "journal_mode(WAL)")
			q.Add("_pragma", "busy_timeout(5000)")
		}
		return target{dialect: sqlstore.SQLite, driver: "sqlite", dsn: "file:" + path + "?" + q.Encode(), shown: r.redact("sqlite://" + path), file: path}, nil
	}
	return target{}, usagef("--database-url: unknown scheme %q: want postgres://, mysql://, sqlite://, a keyword/value string (host=… dbname=…) or a file path", cut(scheme, 20))
}

// store is an open outbox: its database and the tables' names.
type store struct {
	target
	db     *sql.DB
	names  *sqlstore.Names
	outbox *outboxsql.Outbox
	q      sqlstore.DB
}

// open connects to the outbox the flags name. create allows a new SQLite file (migrate);
// other commands refuse a file that does not exist rather than create an empty database.
func (a *app) open(ctx context.Context, f dbFlags, create bool) (*store, error) {
	t, err := parseDatabaseURL(f.url, a.stderr)
	if err != nil {
		return nil, err
	}
	s, err := outboxOn(t, f) // the flags' errors before connecting
	if err != nil {
		return nil, err
	}
	db, err := a.connect(ctx, t, create)
	if err != nil {
		return nil, err
	}
	return s.on(db), nil
}

// connect opens the database of t and makes sure it answers. create allows a new SQLite
// file.
func (a *app) connect(ctx context.Context, t target, create bool) (*sql.DB, error) {
	if t.file != "" && !create {
		if _, err := os.Stat(t.file); err != nil {
			return nil, fmt.Errorf("SQLite database %s: %w (run outbox migrate to create it)", t.file, err)
		}
	}
	db, err := sql.Open(t.driver, t.dsn)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", t.shown, a.stderr.hide(err))
	}
	if t.dialect == sqlstore.SQLite {
		db.SetMaxOpenConns(1) // one writer: the connections would only queue on its lock
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		db.Close()
		return nil, fmt.Errorf("connecting to %s: %w", t.shown, a.stderr.hide(err))
	}
	return db, nil
}

// outboxOn returns the outbox f's --schema and --table name in the database of t, not yet
// connected (see on): the names checked.
func outboxOn(t target, f dbFlags) (*store, error) {
	names, err := f.names(t.dialect)
	if err != nil {
		return nil, err
	}
	d := map[string]*outboxsql.Outbox{"postgres": outboxsql.Postgres, "mysql": outboxsql.MySQL, "sqlite": outboxsql.SQLite}[t.dialect.Name()]
	o, err := outboxsql.New(d, f.tables())
	if err != nil {
		return nil, usagef("--schema, --table: %v", err)
	}
	return &store{target: t, names: names, outbox: o}, nil
}

// on returns s connected to db, its database.
func (s *store) on(db *sql.DB) *store {
	s.db, s.q = db, sqlstore.StdDB(db)
	return s
}

func (s *store) Close() error { return s.db.Close() }

// deadLetters opens the outbox's dead-letter table.
func (s *store) deadLetters() deadletter.Table {
	t, err := s.outbox.NewDeadLetters(s.db)
	if err != nil {
		panic(err) // only for a nil *sql.DB
	}
	return t
}

// describe names the outbox for messages: its table on its database.
func (s *store) describe() string {
	return s.names.Outbox + " on " + s.shown
}

// checkSchema fails with a message that says what to do when the outbox's tables are not
// those this version expects.
// openMigrated opens the outbox the flags name, as open does, for a long-running command
// (relay, serve) that must not start on tables this version does not expect.
func (a *app) openMigrated(ctx context.Context, f dbFlags) (*store, error) {
	s, err := a.open(ctx, f, false)
	if err != nil {
		return nil, err
	}
	if err := s.checkSchema(ctx); err != nil {
		s.Close()
		return nil, a.stderr.hide(err)
	}
	return s, nil
}

func (s *store) checkSchema(ctx context.Context) error {
	err := sqlstore.Validate(ctx, s.dialect, s.q, s.names)
	if errors.Is(err, sqlstore.ErrSchema) {
		return fmt.Errorf("%w\n(run outbox migrate, with the same --database-url, --schema and --table)", err)
	}
	return err
}
