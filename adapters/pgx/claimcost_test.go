package outboxpgx_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
// and by two at once (lanes 0 and 1 of 2, as a relay's default Concurrency), each on a
// connection of its own, claiming $TXOUTBOX_CLAIM_LIMIT rows (500, the default BatchSize)
// and completing them at once. The two outboxes drain in turns of 20 claims per loop, so
// that load from elsewhere on the machine weighs on both. Per claim it reports the CPU time
// the server's backend spent on it (read from /proc/<pid>/schedstat, so only for a local
// server; mean and median), which other processes on a busy machine disturb far less than
// the time the call took, also reported (mean). It ignores b.N:
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
				ctx := context.Background()
				admin, err := pgxpool.New(ctx, outboxtest.PostgresURL())
				if err == nil {
					err = admin.Ping(ctx)
				}
				outboxtest.RequireService(b, "PostgreSQL", err)
				b.Cleanup(admin.Close)
				old := newClaimCostOutbox(b, admin, "claimcost_base", baseMigrations, loops)
				now := newClaimCostOutbox(b, admin, "claimcost_head", nil, loops)
				for _, o := range []*claimCostOutbox{old, now} {
					o.fill(b, admin, rows, shape.keys)
				}
				for _, q := range []string{"VACUUM ANALYZE " + old.schema + ".outbox", "VACUUM ANALYZE " + now.schema + ".outbox", "CHECKPOINT"} {
					if _, err := admin.Exec(ctx, q); err != nil {
						b.Fatal(err)
					}
				}
				for old.claimed < rows || now.claimed < rows {
					for _, o := range []*claimCostOutbox{old, now} {
						if o.claimed < rows {
							o.turn(b, limit, 20)
						}
					}
				}
				for _, o := range []*claimCostOutbox{old, now} {
					b.ReportMetric(o.cpuMean(), o.name+"_cpu_µs/claim")
					b.ReportMetric(o.cpuMedian(), o.name+"_cpu_median_µs/claim")
					b.ReportMetric(float64(o.wall.Microseconds())/float64(o.claims), o.name+"_wall_µs/claim")
					b.ReportMetric(float64(o.claims), o.name+"_claims")
				}
				b.ReportMetric(now.cpuMean()/old.cpuMean(), "head/base_cpu")
				b.ReportMetric(now.cpuMedian()/old.cpuMedian(), "head/base_cpu_median")
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

// claimCostOutbox is one of the two outboxes, its loops, and what their claims cost.
type claimCostOutbox struct {
	name, schema string
	loops        []*claimCostLoop

	mu      sync.Mutex
	token   int64
	claims  int
	claimed int
	wall    time.Duration
	cpu     []time.Duration // per claim
}

// claimCostLoop is one claim loop: a connection of its own, whose backend's CPU time is
// read around each claim.
type claimCostLoop struct {
	conn  *pgx.Conn
	pid   uint32
	store outboxdriver.Store
	state outboxdriver.ClaimState
}

// newClaimCostOutbox creates an outbox in a new schema, migrated by Migrate or by migrations
// when they are given, and its loops.
func newClaimCostOutbox(b *testing.B, admin *pgxpool.Pool, prefix string, migrations []sqlstore.Migration, loops int) *claimCostOutbox {
	ctx := context.Background()
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	schema := prefix + "_" + hex.EncodeToString(suffix)
	o, err := outboxpgx.New(outbox.Tables{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	if migrations == nil {
		err = o.Migrate(ctx, admin)
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
		_, err = admin.Exec(ctx, strings.Join(script, ";\n"))
	}
	if err != nil {
		b.Fatal(err)
	}
	out := &claimCostOutbox{name: strings.TrimPrefix(prefix, "claimcost_"), schema: schema}
	for range loops {
		conn, err := pgx.Connect(ctx, outboxtest.PostgresURL())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = conn.Close(context.Background()) })
		store, err := o.NewStore(conn)
		if err != nil {
			b.Fatal(err)
		}
		out.loops = append(out.loops, &claimCostLoop{conn: conn, pid: conn.PgConn().PID(), store: store})
	}
	return out
}

// fill writes n rows, keyless (keys 0) or keyed round-robin by keys keys.
func (o *claimCostOutbox) fill(b *testing.B, admin *pgxpool.Pool, n, keys int) {
	key := "''"
	if keys > 0 {
		key = "'order-' || (i % " + strconv.Itoa(keys) + ")"
	}
	_, err := admin.Exec(context.Background(), "INSERT INTO "+o.schema+`.outbox (id, type, key, content_type, body, created_at)
SELECT gen_random_uuid(), 'bench.order_placed', `+key+`, 'application/json',
       convert_to('{"ID":' || i || ',"Total":42}', 'UTF8'), now()
  FROM generate_series(1, $1) AS i`, n)
	if err != nil {
		b.Fatal(err)
	}
}

// turn runs claims rounds of claim + complete in each loop, the loops at once.
func (o *claimCostOutbox) turn(b *testing.B, limit, claims int) {
	var wg sync.WaitGroup
	for lane, l := range o.loops {
		wg.Go(func() {
			ctx := context.Background()
			for range claims {
				o.mu.Lock()
				o.token++
				token := o.token
				o.mu.Unlock()
				cpu0 := backendCPU(b, l.pid)
				start := time.Now()
				got, err := l.store.Claim(ctx, outboxdriver.ClaimParams{Owner: "claimcost", Token: token, Limit: limit,
					Lease: time.Minute, Lane: lane, Lanes: len(o.loops), State: &l.state})
				took := time.Since(start)
				cpu := backendCPU(b, l.pid) - cpu0
				if err != nil {
					b.Error(err)
					return
				}
				o.mu.Lock()
				o.claims++
				o.claimed += len(got)
				o.wall += took
				o.cpu = append(o.cpu, cpu)
				o.mu.Unlock()
				if len(got) == 0 {
					continue
				}
				seqs := make([]int64, len(got))
				for i, c := range got {
					seqs[i] = c.Seq
				}
				if err := l.store.Complete(ctx, token, seqs); err != nil {
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

func (o *claimCostOutbox) cpuMean() float64 {
	var sum time.Duration
	for _, c := range o.cpu {
		sum += c
	}
	return float64(sum.Microseconds()) / float64(max(len(o.cpu), 1))
}

func (o *claimCostOutbox) cpuMedian() float64 {
	s := slices.Clone(o.cpu)
	slices.Sort(s)
	return float64(s[len(s)/2].Microseconds())
}

// backendCPU is the CPU time the server process pid has run for (Linux schedstat).
func backendCPU(b *testing.B, pid uint32) time.Duration {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		b.Fatalf("reading the CPU time of PostgreSQL's backend %d (a local server is needed): %v", pid, err)
	}
	ns, err := strconv.ParseInt(strings.Fields(string(stat))[0], 10, 64)
	if err != nil {
		b.Fatal(err)
	}
	return time.Duration(ns)
}
