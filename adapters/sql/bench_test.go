package outboxsql_test

import (
	"context"
	"database/sql"
	"slices"
	"strconv"
	"strings"
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

// BenchmarkRelayDrain drains a keyless backlog on MySQL/MariaDB and SQLite with the relay
// (default config: batches of 500, two loops) and with a hand-written loop that claims the
// oldest 500 rows and deletes them, one transaction per batch, on one connection: on MySQL
// SELECT … ORDER BY seq LIMIT 500 FOR UPDATE SKIP LOCKED then DELETE of those rows (MySQL
// has no DELETE … RETURNING), on SQLite one DELETE … RETURNING of the oldest 500. Raw loop
// and relay alternate for five rounds, each on a fresh backlog; medians are reported, and
// relay/raw is the relay's rate as a ratio to the raw loop's.
//
//	go test -run '^$' -bench 'RelayDrain$' -benchtime 1x ./adapters/sql
func BenchmarkRelayDrain(b *testing.B) {
	const n, batch, rounds = 50000, 500, 5
	for _, d := range dialects {
		if d.name == "postgres" { // adapters/pgx measures PostgreSQL
			continue
		}
		b.Run(d.name, func(b *testing.B) {
			o := newTestOutbox(b, d.name, d.dialect, d.driver)
			// CPU per event of this process (the relay or the raw loop; SQLite too) and of
			// the MariaDB/MySQL server (all of it: whatever else uses it counts as well).
			meters := []benchtest.Meter{benchtest.Processes("self")}
			if d.name == "mysql" {
				meters = append(meters, benchtest.Processes("server", "mariadbd", "mysqld"))
			}
			metered := func(cpu [][]float64, drain func() float64) float64 {
				before := make([]int64, len(meters))
				for i, m := range meters {
					before[i] = m.Read()
				}
				rate := drain()
				for i, m := range meters {
					cpu[i] = append(cpu[i], float64(m.Read()-before[i])*1e6/benchtest.ClockTicks/n)
				}
				return rate
			}
			var raw, lib []float64
			rawCPU, libCPU := make([][]float64, len(meters)), make([][]float64, len(meters))
			for range rounds {
				fillBench(b, o, n, func(int) string { return "" })
				raw = append(raw, metered(rawCPU, func() float64 { return drainRaw(b, o, n, batch) }))
				fillBench(b, o, n, func(int) string { return "" })
				lib = append(lib, metered(libCPU, func() float64 {
					return benchtest.DrainRelay(b, o.store(b), n, nil, time.Minute)
				}))
			}
			rawRate, libRate := median(raw), median(lib)
			b.ReportMetric(rawRate, "raw_events/s")
			b.ReportMetric(libRate, "relay_events/s")
			b.ReportMetric(libRate/rawRate, "relay/raw")
			for i, m := range meters {
				b.ReportMetric(median(rawCPU[i]), "raw_"+m.Name+"_cpu_µs/event")
				b.ReportMetric(median(libCPU[i]), "relay_"+m.Name+"_cpu_µs/event")
			}
		})
	}
}

// drainRaw empties o's outbox of its n rows with the hand-written claim+DELETE loop, in
// batches of batch rows, and returns events/s.
func drainRaw(b *testing.B, o *testOutbox, n, batch int) float64 {
	b.Helper()
	ctx := context.Background()
	table := o.OutboxTable()
	cols := "seq, id, type, `key`, headers, content_type, body, created_at"
	if o.Dialect == "sqlite" {
		cols = strings.ReplaceAll(cols, "`", `"`)
	}
	conn, err := o.DB.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	// scan reads a batch's rows, as the relay reads them, and returns their seqs.
	scan := func(rows *sql.Rows) []int64 {
		var seqs []int64
		for rows.Next() {
			var (
				seq         int64
				id, typ, ky string
				hdr         []byte
				ct          string
				body        []byte
				at          any // SQLite's text, MySQL's time
			)
			if err := rows.Scan(&seq, &id, &typ, &ky, &hdr, &ct, &body, &at); err != nil {
				b.Fatal(err)
			}
			seqs = append(seqs, seq)
		}
		if err := rows.Err(); err != nil {
			b.Fatal(err)
		}
		return seqs
	}
	batchOnce := func() int {
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer tx.Rollback()
		var seqs []int64
		if o.Dialect == "sqlite" {
			rows, err := tx.QueryContext(ctx, "DELETE FROM "+table+" WHERE seq IN (SELECT seq FROM "+table+
				" ORDER BY seq LIMIT ?) RETURNING "+cols, batch)
			if err != nil {
				b.Fatal(err)
			}
			seqs = scan(rows)
		} else {
			rows, err := tx.QueryContext(ctx, "SELECT "+cols+" FROM "+table+" ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED", batch)
			if err != nil {
				b.Fatal(err)
			}
			if seqs = scan(rows); len(seqs) > 0 {
				in := make([]string, len(seqs))
				for i, s := range seqs {
					in[i] = strconv.FormatInt(s, 10)
				}
				if _, err := tx.ExecContext(ctx, "DELETE FROM "+table+" WHERE seq IN ("+strings.Join(in, ",")+")"); err != nil {
					b.Fatal(err)
				}
			}
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
		return len(seqs)
	}
	start := time.Now()
	for done := 0; done < n; {
		got := batchOnce()
		if got == 0 {
			b.Fatalf("the outbox ran dry after %d of %d rows", done, n)
		}
		done += got
	}
	return float64(n) / time.Since(start).Seconds()
}

// fillBench publishes n events to o's outbox, 1,000 per transaction, event i keyed key(i).
func fillBench(b *testing.B, o *testOutbox, n int, key func(i int) string) {
	b.Helper()
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
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
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
				fillBench(b, o, n, key)
				rate := benchtest.DrainRelay(b, o.store(b), n, nil, time.Minute)
				// Dropped now, not when the benchmark ends, so that the drained outboxes do
				// not crowd the server's buffers for the later drains.
				if err := o.Unmigrate(context.Background()); err != nil {
					b.Fatal(err)
				}
				return rate
			})
		})
	}
}
