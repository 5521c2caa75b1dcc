package sqlstore

import (
	"cmp"
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/txoutbox/outbox/outboxdriver"
)

// Claims by key runs, for the dialects whose claim is Go code (MySQL, SQLite: mysql_store.go
// and sqlite_store.go read top to bottom with this file). PostgreSQL's claim function
// (migrations/postgres/004) applies the same rules in SQL; why they keep each key's order is
// argued once, in docs/ordering.md:
//
//   - A key's run is its rows in seq order from its first (its head) up to, not including,
//     the first that is leased or waiting for a retry. A claim takes keyless rows that are
//     free and rows of runs, never another row of a key: so no row goes while an earlier
//     row of its key is in flight or waiting, and a row that becomes visible late is its
//     key's head then (claimed, never skipped).
//   - The claim reads a window, the first claimWindow(limit) rows, and takes its free
//     keyless rows and its keys' runs oldest first, the runs of the older half of its keys
//     before the others, which it leaves to a concurrent claim when it is full.
//   - Past a full window that did not fill the claim, keys' heads come from a loose index
//     scan over (key, seq), one probe per key, from a random key of the window, wrapping
//     around, at most 4 × limit keys: the cost follows the number of keys, never the depth
//     of the backlog.

// claimRow is an outbox row as a claim plans it.
type claimRow struct {
	seq  int64
	key  string
	free bool // due, and not leased
}

// claimCandidate is a row a claim means to lease: its wave (its place in its key's run, for
// runs found beyond the window), and whether its key is in the younger half of the
// window's keys.
type claimCandidate struct {
	claimRow
	wave  int
	later bool
}

// claimWindow is how many of the outbox's first rows a claim of limit rows reads, unless
// its loop asks for a wider one (MySQL's mysqlLoop, as PostgreSQL's pgLoop).
func claimWindow(limit int) int { return 2 * limit }

// planClaim picks the rows a claim of limit rows should lease: what planWindow finds in the
// window, the outbox's first width rows, and, past a full window that leaves room, what
// planDeep finds beyond it. The rows found in the window have wave 0.
func (s *leaseStore) planClaim(ctx context.Context, q Querier, limit, width int) ([]claimCandidate, error) {
	window, err := s.claimRows(ctx, q, `SELECT seq, `+s.sql.key+`, `+s.free("")+` FROM `+s.n.Outbox+
		` ORDER BY seq LIMIT `+strconv.Itoa(width))
	if err != nil {
		return nil, err
	}
	plan := planWindow(window, limit)
	if len(window) < width || len(plan) >= limit {
		return plan, nil
	}
	deep, err := s.planDeep(ctx, q, window, plan, limit)
	if err != nil {
		return nil, err
	}
	return append(plan, deep...), nil
}

// planWindow applies the run rules to window, the outbox's first rows in seq order.
func planWindow(window []claimRow, limit int) []claimCandidate {
	var (
		out    []claimCandidate
		rank   = map[string]int{} // keys with a run, by the order of their heads
		broken = map[string]bool{}
	)
	for _, r := range window {
		switch {
		case r.key == "":
			if r.free {
				out = append(out, claimCandidate{claimRow: r})
			}
		case broken[r.key]:
		case !r.free:
			broken[r.key] = true
		default:
			if _, ok := rank[r.key]; !ok {
				rank[r.key] = len(rank)
			}
			out = append(out, claimCandidate{claimRow: r})
		}
	}
	for i, c := range out {
		if c.key != "" {
			out[i].later = rank[c.key] >= (len(rank)+1)/2
		}
	}
	slices.SortFunc(out, func(a, b claimCandidate) int {
		if a.later != b.later {
			if a.later {
				return 1
			}
			return -1
		}
		return cmp.Compare(a.seq, b.seq)
	})
	return out[:min(len(out), limit)]
}

// planDeep finds up to limit - len(plan) more rows beyond a full window: keyless rows after
// it, the runs of keys whose heads are free and that the plan does not hold already, and
// the rest of the runs the window cut short, (limit - len(plan)) / keys deep, merged in
// waves.
func (s *leaseStore) planDeep(ctx context.Context, q Querier, window []claimRow, plan []claimCandidate, limit int) ([]claimCandidate, error) {
	rest := limit - len(plan)
	var out []claimCandidate
	keyless, err := s.claimRows(ctx, q, `SELECT seq, `+s.sql.key+`, 1 FROM `+s.n.Outbox+` WHERE `+s.sql.key+` = '' AND seq > ? AND `+
		s.free("")+` ORDER BY seq LIMIT ?`, window[len(window)-1].seq, rest)
	if err != nil {
		return nil, err
	}
	for _, r := range keyless {
		out = append(out, claimCandidate{claimRow: r, wave: 1})
	}

	var keyed []string
	for _, r := range window {
		if r.key != "" {
			keyed = append(keyed, r.key)
		}
	}
	start := ""
	if len(keyed) > 0 {
		start = keyed[rand.IntN(len(keyed))]
	}
	heads, err := s.claimRows(ctx, q, s.heads(true), start, 4*limit)
	if err != nil {
		return nil, err
	}
	if n := 4*limit - len(heads); n > 0 && start != "" {
		lower, err := s.claimRows(ctx, q, s.heads(false), start, n)
		if err != nil {
			return nil, err
		}
		heads = append(heads, lower...)
	}
	inPlan := map[string]bool{}
	for _, c := range plan {
		inPlan[c.key] = true
	}
	heads = slices.DeleteFunc(heads, func(h claimRow) bool { return !h.free || inPlan[h.key] })
	slices.SortFunc(heads, func(a, b claimRow) int { return cmp.Compare(a.seq, b.seq) })
	heads = heads[:min(len(heads), rest)]
	// A key whose rows in the window are all in the plan (the plan is not full, so none was
	// cut) has its run cut short by the window only: it goes on after the window.
	last := window[len(window)-1].seq
	cut := map[string]bool{}
	for _, r := range window {
		if r.key != "" && !r.free {
			cut[r.key] = true
		}
	}
	for key := range inPlan {
		if key != "" && !cut[key] && len(heads) < rest {
			heads = append(heads, claimRow{seq: last + 1, key: key, free: true})
		}
	}

	if len(heads) > 0 {
		depth := (rest + len(heads) - 1) / len(heads)
		// One statement per 50 keys: each key's rows from its head, depth at most.
		const perStatement = 50
		for chunk := range slices.Chunk(heads, perStatement) {
			parts := make([]string, len(chunk))
			args := make([]any, 0, 3*len(chunk))
			for i, h := range chunk {
				parts[i] = `SELECT * FROM (SELECT seq, ` + s.sql.key + `, ` + s.free("") + ` FROM ` + s.n.Outbox +
					` WHERE ` + s.sql.key + ` = ? AND seq >= ? ORDER BY seq LIMIT ?) AS r` + strconv.Itoa(i)
				args = append(args, h.key, h.seq, depth)
			}
			rows, err := s.claimRows(ctx, q, strings.Join(parts, " UNION ALL "), args...)
			if err != nil {
				return nil, err
			}
			slices.SortFunc(rows, func(a, b claimRow) int { return cmp.Or(strings.Compare(a.key, b.key), cmp.Compare(a.seq, b.seq)) })
			wave, key := 0, ""
			for _, r := range rows {
				if r.key != key {
					wave, key = 0, r.key
				}
				if wave < 0 || !r.free {
					wave = -1 // the run ended
					continue
				}
				wave++
				out = append(out, claimCandidate{claimRow: r, wave: wave})
			}
		}
	}
	slices.SortFunc(out, func(a, b claimCandidate) int { return cmp.Or(cmp.Compare(a.wave, b.wave), cmp.Compare(a.seq, b.seq)) })
	return out[:min(len(out), rest)], nil
}

// onlyKeyless reports whether the outbox holds no keyed row (one probe of the keyed index):
// then a claim is a plain queue read of the oldest free rows, which need no order (O2).
func (s *leaseStore) onlyKeyless(ctx context.Context, q Querier) (bool, error) {
	rows, err := q.Query(ctx, "SELECT 1 FROM "+s.n.Outbox+" WHERE "+s.sql.key+" <> '' LIMIT 1")
	if err != nil {
		return false, err
	}
	defer rows.Close()
	return !rows.Next(), rows.Err()
}

// oldestKeyless is the condition that picks the oldest free keyless rows, up to limit.
func (s *leaseStore) oldestKeyless(limit int) string {
	return s.sql.key + " = '' AND " + s.free("") + " ORDER BY seq LIMIT " + strconv.Itoa(limit)
}

// free is the dialect's "row is due and not leased" expression over the columns of alias
// ("" for none): the one definition of a free row for MySQL and SQLite (docs/ordering.md,
// O1), as PostgreSQL's is its is_free function.
func (s *leaseStore) free(alias string) string {
	p := ""
	if alias != "" {
		p = alias + "."
	}
	now := s.sql.now
	return "(" + p + "available_at <= " + now + " AND (" + p + "lease_until IS NULL OR " + p + "lease_until <= " + now + "))"
}

// claimRows runs a query of (seq, key, free) rows.
func (s *leaseStore) claimRows(ctx context.Context, q Querier, query string, args ...any) ([]claimRow, error) {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []claimRow
	for rows.Next() {
		var (
			r    claimRow
			free int64
		)
		if err := rows.Scan(&r.seq, &r.key, &free); err != nil {
			return nil, err
		}
		r.free = free != 0
		out = append(out, r)
	}
	return out, rows.Err()
}

// keepRuns returns the candidates to keep once the rows in got have been locked (MySQL) or
// leased (SQLite): every keyless one in got, and of each key the candidates up to its
// first one missing from got — a row that another claim took since the plan, or that a
// write-back holds, ends its key's run (docs/ordering.md, O5). The rest are the candidates
// in got to give back.
func keepRuns(cands []claimCandidate, got map[int64]bool) (keep, giveBack []int64) {
	ended := map[string]bool{}
	bySeq := slices.Clone(cands)
	slices.SortFunc(bySeq, func(a, b claimCandidate) int { return cmp.Compare(a.seq, b.seq) })
	for _, c := range bySeq {
		switch {
		case !got[c.seq]:
			if c.key != "" {
				ended[c.key] = true
			}
		case c.key != "" && ended[c.key]:
			giveBack = append(giveBack, c.seq)
		default:
			keep = append(keep, c.seq)
		}
	}
	return keep, giveBack
}

// keptRuns returns the claims of got, the rows of plan that were locked (MySQL) or leased
// (SQLite), that keepRuns keeps, and the seqs of the others, to give back.
func keptRuns(plan []claimCandidate, got []outboxdriver.Claimed) (kept []outboxdriver.Claimed, giveBack []int64) {
	seqs := make(map[int64]bool, len(got))
	for _, c := range got {
		seqs[c.Seq] = true
	}
	keep, giveBack := keepRuns(plan, seqs)
	keeping := make(map[int64]bool, len(keep))
	for _, seq := range keep {
		keeping[seq] = true
	}
	return slices.DeleteFunc(got, func(c outboxdriver.Claimed) bool { return !keeping[c.Seq] }), giveBack
}

// candidateSeqs are the seqs of plan.
func candidateSeqs(plan []claimCandidate) []int64 {
	seqs := make([]int64, len(plan))
	for i, c := range plan {
		seqs[i] = c.seq
	}
	return seqs
}

// claimedSeqs are the seqs of claimed.
func claimedSeqs(claimed []outboxdriver.Claimed) []int64 {
	seqs := make([]int64, len(claimed))
	for i, c := range claimed {
		seqs[i] = c.Seq
	}
	return seqs
}
