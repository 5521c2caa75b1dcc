package outboxpgx_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox"
	outboxpgx "github.com/txoutbox/outbox/adapters/pgx"
	"github.com/txoutbox/outbox/internal/sqlstore"
	"github.com/txoutbox/outbox/outboxdriver"
	"github.com/txoutbox/outbox/outboxtest"
)

// BenchmarkClaimCost measures what one claim costs the database: the claim function of the
// commit $TXOUTBOX_CLAIM_BASE (its PostgreSQL migrations, rendered into a schema of their
// own) against this tree's, on two copies of one outbox of $TXOUTBOX_CLAIM_ROWS rows (100k)
// keyless, over 10 keys, over 1,000 keys and with every key distinct. Both are driven by
// this tree's store (the base's claim function gets the arguments it ignores), by one loop
// and by two at once (lanes 0 and 1 of 2, as a relay's default Concurrency), each claiming
// $TXOUTBOX_CLAIM_LIMIT rows (500, the default BatchSize) and completing them at once. The
// two drain in turns of 20 claims per loop, so that load from elsewhere on the machine
// weighs on both. It reports, per claim: the time the call took as the client saw it, and
// the time the server spent in the claim function (pg_stat_user_functions). It ignores b.N:
//
//	TXOUTBOX_CLAIM_BASE=174ebef go test -run '^$' -bench ClaimCost -benchtime 1x ./adapters/pgx
func BenchmarkClaimCost(b *testing.B) {
	base := os.Getenv("TXOUTBOX_CLAIM_BASE")
	if base == "" {
		b.Skip("set TXOUTBOX_CLAIM_BASE to a commit (e.g. 174ebef) to compare its claim with this tree's")
	}
	baseMigrations := claimCostBaseMigrations(b, base)
	rows, limit := claimCostEnv(b, "TXOUTBOX_CLAIM_ROWS", 100000), claimCostEnv(b, "TXOUTBOX_CLAIM_LIMIT", 500)
	shapes := []struct {
		name string
		keys int
	}{{"keyless", 0}, {"10", 10}, {"1000", 1000}, {"distinct", rows}}
	for _, loops := range []int{1, 2} {
		for _, shape := range shapes {
			b.Run(fmt.Sprintf("loops=%d/keys=%s", loops, shape.name), func(b *testing.B) {
				pool := claimCostPool(b, loops)
				old := newClaimCostOutbox(b, pool, "claimcost_base", baseMigrations)
				now := newClaimCostOutbox(b, pool, "claimcost_head", nil)
				for _, o := range []*claimCostOutbox{old, now} {
					o.fill(b, rows, shape.keys)
				}
				for _, q := range []string{"VACUUM ANALYZE " + old.schema + ".outbox", "VACUUM ANALYZE " + now.schema + ".outbox", "CHECKPOINT"} {
					if _, err := pool.Exec(context.Background(), q); err != nil {
						b.Fatal(err)
					}
				}
				for old.claimed < rows || now.claimed < rows {
					for _, o := range []*claimCostOutbox{old, now} {
						if o.claimed < rows {
							o.turn(b, loops, limit, 20)
						}
					}
				}
				for _, o := range []*claimCostOutbox{old, now} {
					o.serverTime(b, pool)
					b.ReportMetric(o.clientMicros(), o.name+"_µs/claim")
					b.ReportMetric(o.serverMicros, o.name+"_server_µs/claim")
					b.ReportMetric(float64(o.claims), o.name+"_claims")
				}
				b.ReportMetric(now.clientMicros()/old.clientMicros(), "head/base")
				b.ReportMetric(now.serverMicros/old.serverMicros, "head/base_server")
			})
		}
	}
}

func claimCostEnv(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("$%s=%q is not a positive number", name, v)
	}
	return n
}

// claimCostBaseMigrations reads the PostgreSQL migrations of commit base with git. A claim
// function of before ClaimState gets this tree's arguments, which it ignores, and returns
// the step column this tree's store reads (3, as if from the window).
func claimCostBaseMigrations(b *testing.B, base string) []sqlstore.Migration {
	const dir = "internal/sqlstore/migrations/postgres"
	git := func(args ...string) string {
		out, err := exec.Command("git", args...).Output()
		if err != nil {
			b.Fatalf("git %s: %v", strings.Join(args, " "), err)
		}
		return string(out)
	}
	root := strings.TrimSpace(git("rev-parse", "--show-toplevel"))
	var out []sqlstore.Migration
	for _, file := range strings.Fields(git("-C", root, "ls-tree", "--name-only", base, dir+"/")) {
		num, name, _ := strings.Cut(strings.TrimSuffix(path.Base(file), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if err != nil {
			b.Fatalf("migration file %s: %v", file, err)
		}
		sql := git("-C", root, "show", base+":"+file)
		if v == 4 && !strings.Contains(sql, "p_window integer") { // a claim of before ClaimState
			for _, r := range [][2]string{
				{"p_lane integer, p_lanes integer)", "p_lane integer, p_lanes integer, p_window integer, p_probe boolean, p_backlog boolean, p_start double precision)"},
				{"attempts integer, first_failed_at timestamptz)", "attempts integer, first_failed_at timestamptz, step smallint)"},
				{"o.attempts, o.first_failed_at;", "o.attempts, o.first_failed_at, 3::smallint;"},
			} {
				if !strings.Contains(sql, r[0]) {
					b.Fatalf("the claim function of %s has no %q: adapt claimCostBaseMigrations", base, r[0])
				}
				sql = strings.ReplaceAll(sql, r[0], r[1])
			}
		}
		// Names of functions that this tree no longer has.
		sql = strings.ReplaceAll(sql, "{{.Lease}}", `{{if .Schema}}"{{.Schema}}".{{end}}"{{.Prefix}}_lease"`)
		out = append(out, sqlstore.Migration{Version: v, Name: name, SQL: sql})
	}
	return out
}

// claimCostPool is a pool of one connection per loop, which counts the time spent in
// PL/pgSQL functions.
func claimCostPool(b *testing.B, loops int) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(outboxtest.PostgresURL())
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = int32(loops)
	cfg.ConnConfig.RuntimeParams["track_functions"] = "pl"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err == nil {
		err = pool.Ping(context.Background())
	}
	outboxtest.RequireService(b, "PostgreSQL", err)
	b.Cleanup(pool.Close)
	return pool
}

// claimCostOutbox is one of the two outboxes and what its claims cost.
type claimCostOutbox struct {
	name, schema string
	pool         *pgxpool.Pool
	store        outboxdriver.Store
	states       []*outboxdriver.ClaimState
	token        int64

	mu           sync.Mutex
	claims       int
	claimed      int
	elapsed      time.Duration
	serverMicros float64
}

// newClaimCostOutbox creates an outbox in a new schema: migrated by Migrate, or by
// migrations when they are given.
func newClaimCostOutbox(b *testing.B, pool *pgxpool.Pool, prefix string, migrations []sqlstore.Migration) *claimCostOutbox {
	ctx := context.Background()
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	schema := prefix + "_" + hex.EncodeToString(suffix)
	o, err := outboxpgx.New(outbox.Tables{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	if migrations == nil {
		err = o.Migrate(ctx, pool)
	} else {
		names, nerr := sqlstore.NewNames(sqlstore.Postgres, outbox.Tables{Schema: schema})
		if nerr != nil {
			b.Fatal(nerr)
		}
		script := []string{"CREATE SCHEMA " + schema}
		for _, m := range migrations {
			sql, rerr := sqlstore.Render(sqlstore.Postgres, m, names)
			if rerr != nil {
				b.Fatal(rerr)
			}
			script = append(script, sql)
		}
		_, err = pool.Exec(ctx, strings.Join(script, ";\n"))
	}
	if err != nil {
		b.Fatal(err)
	}
	store, err := o.NewStore(pool)
	if err != nil {
		b.Fatal(err)
	}
	name := strings.TrimPrefix(prefix, "claimcost_")
	return &claimCostOutbox{name: name, schema: schema, pool: pool, store: store,
		states: []*outboxdriver.ClaimState{new(outboxdriver.ClaimState), new(outboxdriver.ClaimState)}}
}

// fill writes n rows, keyless (keys 0) or keyed round-robin by keys keys.
func (o *claimCostOutbox) fill(b *testing.B, n, keys int) {
	key := "''"
	if keys > 0 {
		key = "'order-' || (i % " + strconv.Itoa(keys) + ")"
	}
	_, err := o.pool.Exec(context.Background(), "INSERT INTO "+o.schema+`.outbox (id, type, key, content_type, body, created_at)
SELECT gen_random_uuid(), 'bench.order_placed', `+key+`, 'application/json',
       convert_to('{"ID":' || i || ',"Total":42}', 'UTF8'), now()
  FROM generate_series(1, $1) AS i`, n)
	if err != nil {
		b.Fatal(err)
	}
}

// turn runs claims rounds of claim + complete in each of loops loops at once.
func (o *claimCostOutbox) turn(b *testing.B, loops, limit, claims int) {
	var wg sync.WaitGroup
	for lane := range loops {
		wg.Go(func() {
			ctx := context.Background()
			for range claims {
				o.mu.Lock()
				o.token++
				token := o.token
				o.mu.Unlock()
				start := time.Now()
				got, err := o.store.Claim(ctx, outboxdriver.ClaimParams{Owner: "claimcost", Token: token, Limit: limit,
					Lease: time.Minute, Lane: lane, Lanes: loops, State: o.states[lane]})
				took := time.Since(start)
				if err != nil {
					b.Error(err)
					return
				}
				o.mu.Lock()
				o.claims++
				o.claimed += len(got)
				o.elapsed += took
				o.mu.Unlock()
				if len(got) == 0 {
					continue
				}
				seqs := make([]int64, len(got))
				for i, c := range got {
					seqs[i] = c.Seq
				}
				if err := o.store.Complete(ctx, token, seqs); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
}

func (o *claimCostOutbox) clientMicros() float64 {
	return float64(o.elapsed.Microseconds()) / float64(max(o.claims, 1))
}

// serverTime reads the time the server spent in the outbox's claim function per call.
func (o *claimCostOutbox) serverTime(b *testing.B, pool *pgxpool.Pool) {
	ctx := context.Background()
	// The pool's connections report their counts when they end.
	pool.Reset()
	var total float64
	var calls int64
	outboxtest.WaitFor(b, 10*time.Second, "the claim function's statistics", func() bool {
		err := pool.QueryRow(ctx, `SELECT coalesce(sum(total_time), 0), coalesce(sum(calls), 0) FROM pg_stat_user_functions
 WHERE schemaname = $1 AND funcname = 'outbox_claim'`, o.schema).Scan(&total, &calls)
		if err != nil {
			b.Fatal(err)
		}
		return calls >= int64(o.claims)
	})
	o.serverMicros = 1000 * total / float64(calls)
}
