package sqlstore

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/txoutbox/outbox/outboxdriver"
)

// mysqlStore is MySQL's relay store: its claim (below, with runs.go), the write-backs that
// carry a value per row, and those it shares with SQLite (leasestore.go).
type mysqlStore struct{ leaseStore }

func newMySQLStore(db DB, n *Names) *mysqlStore {
	s := &mysqlStore{leaseStore{db: db, n: n, sql: mysqlSQL}}
	k := mysqlSQL.key
	// MySQL and MariaDB read the first row of each group of an index as a loose index scan
	// ("Using index for group-by").
	s.heads = func(upper bool) string {
		op := ">="
		if !upper {
			op = "<"
		}
		return `SELECT o.seq, o.` + k + `, ` + s.free("o") + `
  FROM (SELECT ` + k + `, MIN(seq) AS seq FROM ` + n.Outbox + `
         WHERE ` + k + ` <> '' AND ` + k + ` ` + op + ` ?
         GROUP BY ` + k + ` ORDER BY ` + k + ` LIMIT ?) AS h
  JOIN ` + n.Outbox + ` AS o ON o.seq = h.seq`
	}
	return s
}

// Claim is PostgreSQL's claim function as one READ COMMITTED transaction:
//
//  1. an outbox without keyed rows is a plain queue: its oldest free rows, FOR UPDATE SKIP
//     LOCKED, without the claim lock;
//  2. otherwise plan the claim (planClaim) with plain reads; if there is nothing to claim,
//     stop without waiting for the claim lock. A loop in a backlog (its last claim came
//     back full of keyed rows) skips this plan, and the probe of step 1 but every
//     mysqlProbeEvery-th time: it will find something, and the plan under the lock is the
//     one that counts (mysqlLoop);
//  3. lock the claim-lock row, so claims of one outbox run one at a time and each sees
//     every lease committed before it (a row lock ends with the transaction, as
//     pg_advisory_xact_lock does; GET_LOCK would outlive the commit unless released by
//     hand on the same connection, and a release lost to a cancelled context would stall
//     every relay), and plan again: claims that held the lock meanwhile are now visible;
//  4. lock the planned rows FOR UPDATE SKIP LOCKED, re-checking that they are free, and
//     keep of each key's run the rows up to the first one missing (keepRuns): write-backs
//     do not take the claim lock here, so a relay whose lease expired may be rescheduling
//     a row of the run;
//  5. stamp the lease on them: an update in place, as no column changes size (migration
//     007).
//
// The plans are plain (non-locking) reads: MariaDB extends a statement's FOR UPDATE SKIP
// LOCKED to its subqueries, which would skip a row a write-back holds and let a later row of
// its key overtake it. Why this keeps each key's order: docs/ordering.md.
func (s *mysqlStore) Claim(ctx context.Context, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	var (
		claimed     []outboxdriver.Claimed
		plan        []claimCandidate // under the claim lock
		onlyKeyless bool
		loop        = loopOf[mysqlLoop](p.State)
	)
	err := inTxReadCommitted(ctx, s.db, func(q Querier) (err error) {
		if !loop.backlog() || loop.full%mysqlProbeEvery == 0 {
			if onlyKeyless, err = s.onlyKeyless(ctx, q); err != nil {
				return err
			}
		}
		plan = nil
		var (
			from  = s.n.Outbox + " FORCE INDEX (PRIMARY)" // in seq order: cheaper than through (key, seq)
			which = s.oldestKeyless(p.Limit)
		)
		if !onlyKeyless {
			if !loop.backlog() {
				if plan, err = s.planClaim(ctx, q, p.Limit, loop.window(p.Limit)); err != nil || len(plan) == 0 {
					return err
				}
			}
			found, err := scanRow(ctx, q, nil, "SELECT id FROM "+s.n.ClaimLock+" WHERE id = 1 FOR UPDATE")
			if err != nil {
				return fmt.Errorf("locking %s: %w", s.n.ClaimLock, err)
			}
			if !found {
				return fmt.Errorf("outbox: %s has no row: run Migrate", s.n.ClaimLock)
			}
			if plan, err = s.planClaim(ctx, q, p.Limit, loop.window(p.Limit)); err != nil || len(plan) == 0 {
				return err
			}
			from, which = s.n.Outbox, inSeqs(candidateSeqs(plan))+" AND "+s.free("")
		}
		rows, err := q.Query(ctx, `SELECT seq, id, type, `+s.sql.key+`, `+s.sql.headers+`,
       content_type, body, created_at, attempts + 1, first_failed_at
  FROM `+from+`
 WHERE `+which+`
   FOR UPDATE SKIP LOCKED`)
		if err != nil {
			return err
		}
		locked, err := scanClaimed(rows, p.Limit, loop.backlog(), nil)
		if err != nil {
			return err
		}
		if !onlyKeyless {
			// Rows locked but not kept are unlocked at commit, untouched.
			locked, _ = keptRuns(plan, locked)
		}
		if len(locked) == 0 {
			return nil
		}
		claimed = locked
		// Its values are literals: the Go driver sends a statement without arguments as one
		// query, where it prepares, executes and closes one with arguments (unless the DSN
		// sets interpolateParams), two round trips and a parse for a statement that is new
		// each time anyway (its IN list). The claim's other statements have none either.
		return q.Exec(ctx, `UPDATE `+s.n.Outbox+`
   SET claim_token = `+strconv.FormatInt(p.Token, 10)+`, lease_owner = `+mysqlASCII(mysqlOwner(p.Owner))+`,
       lease_until = `+mysqlNow+` + INTERVAL `+strconv.FormatInt(p.Lease.Microseconds(), 10)+` MICROSECOND,
       attempts = attempts + 1
 WHERE `+inSeqs(claimedSeqs(claimed)))
	})
	if err != nil {
		loop.full = 0
		return nil, err
	}
	loop.learn(p.Limit, len(claimed), onlyKeyless, plan)
	return claimed, nil
}

// mysqlProbeEvery: while a loop's claims come back full of keyed rows, only every 32nd
// probes whether the outbox holds any keyed row (step 1), as PostgreSQL's does.
const mysqlProbeEvery = 32

// mysqlWideFor: a loop whose claim found less than 3/4 of a claim in a full window reads a
// window of 4 × the limit instead of 2 × for its next claims, until 32 of them have been
// filled by the window alone: with few keys, the runs a concurrent claim holds fill the
// front of the window, and the scan beyond it (planDeep) costs more than a wider window
// (PostgreSQL's pgWideFor).
const mysqlWideFor = 32

// mysqlLoop is what MySQL's claim remembers of one relay loop (outboxdriver.ClaimState):
// it changes the cost of a claim, never what it may take (docs/ordering.md).
type mysqlLoop struct {
	// full counts the loop's last claims in a row that came back full of keyed work.
	full int
	// wide counts down the claims left that read the wide window.
	wide int
}

// backlog reports whether the loop's last claim came back full of keyed work.
func (l *mysqlLoop) backlog() bool { return l.full > 0 }

// window is how many rows the loop's next claim of limit rows reads in its window.
func (l *mysqlLoop) window(limit int) int {
	if l.wide > 0 {
		return 2 * claimWindow(limit)
	}
	return claimWindow(limit)
}

// learn updates l after a claim of limit rows that took n, from a keyless outbox or along
// plan.
func (l *mysqlLoop) learn(limit, n int, onlyKeyless bool, plan []claimCandidate) {
	if onlyKeyless {
		l.full = 0
		return
	}
	if n < limit {
		l.full = 0
	} else {
		l.full++
	}
	inWindow := 0
	for _, c := range plan {
		if c.wave == 0 {
			inWindow++
		}
	}
	switch {
	case inWindow >= limit:
		l.wide = max(l.wide-1, 0)
	case inWindow < limit*3/4 && (len(plan) > inWindow || n < limit):
		l.wide = mysqlWideFor
	}
}

// mysqlOwnerBytes is the width of the outbox's lease_owner column, CHAR(64) ASCII.
const mysqlOwnerBytes = 64

// mysqlOwner is the relay's name as the lease_owner column holds it: ASCII (other bytes
// become '?') and cut to mysqlOwnerBytes. The column is fixed-width so that the claim's
// lease is an in-place update of the row (migration 007).
func mysqlOwner(name string) string {
	b := make([]byte, 0, min(len(name), mysqlOwnerBytes))
	for _, r := range name {
		if len(b) == mysqlOwnerBytes {
			break
		}
		if r < 0x20 || r > 0x7e {
			r = '?'
		}
		b = append(b, byte(r))
	}
	return string(b)
}

// Complete deletes delivered rows that still carry token, its values literals as in the
// claim's lease: one round trip.
func (s *mysqlStore) Complete(ctx context.Context, token int64, seqs []int64) error {
	if len(seqs) == 0 {
		return nil
	}
	return s.db.Exec(ctx, "DELETE FROM "+s.n.Outbox+" WHERE claim_token = "+strconv.FormatInt(token, 10)+" AND "+inSeqs(seqs))
}

// mysqlASCII is s (mysqlOwner's ASCII) as a hex string literal, which needs no escaping.
func mysqlASCII(s string) string { return "X'" + hex.EncodeToString([]byte(s)) + "'" }

// Retry records each error made storable (a broker's error text may hold anything).
func (s *mysqlStore) Retry(ctx context.Context, token int64, retries []outboxdriver.Retry) error {
	if len(retries) == 0 {
		return nil
	}
	args := make([]any, 0, 3*len(retries)+1)
	for _, r := range retries {
		msg, _ := cleanText(r.Error, 0, s.sql.lim.bytes)
		args = append(args, r.Seq, r.Delay.Microseconds(), msg)
	}
	return s.db.Exec(ctx, `UPDATE `+s.n.Outbox+` AS o
  JOIN (`+mysqlRowsSQL(len(retries), "seq SIGNED", "delay_us SIGNED", "msg CHAR")+`) AS r
    ON o.seq = r.seq
   SET o.available_at = `+mysqlNow+` + INTERVAL r.delay_us MICROSECOND,
       o.last_error = r.msg,
       o.first_failed_at = COALESCE(o.first_failed_at, `+mysqlNow+`),
       o.claim_token = NULL, o.lease_owner = NULL, o.lease_until = NULL
 WHERE o.claim_token = ?`, append(args, token)...)
}

// DeadLetter moves the rows to the dead-letter table in one transaction (leaseStore): a
// locking read takes them (MySQL has no DELETE ... RETURNING), so they stay this claim's
// until it commits, then they are held or deleted. A claim that planned a run through a
// row being held finds it locked or no longer free, and ends the run there (keepRuns), as
// for a Retry.
func (s *mysqlStore) DeadLetter(ctx context.Context, token int64, dead []outboxdriver.DeadLetter) ([]int64, error) {
	return s.deadLetters(ctx, dead, func(ctx context.Context, q Querier, hold, drop []int64) ([]failedRow, error) {
		rows, err := q.Query(ctx, "SELECT "+s.failedColumns()+" FROM "+s.n.Outbox+" WHERE claim_token = ? AND "+
			inSeqs(append(slices.Clone(hold), drop...))+" FOR UPDATE", token)
		if err != nil {
			return nil, err
		}
		taken, err := scanFailed(rows, false)
		if err != nil || len(taken) == 0 {
			return taken, err
		}
		held, gone := splitTaken(taken, hold)
		if len(held) > 0 {
			if err := q.Exec(ctx, s.holdRows(held), token); err != nil {
				return nil, err
			}
		}
		if len(gone) > 0 {
			if err := q.Exec(ctx, "DELETE FROM "+s.n.Outbox+" WHERE claim_token = ? AND "+inSeqs(gone), token); err != nil {
				return nil, err
			}
		}
		return taken, nil
	})
}

// mysqlRowsSQL builds a derived table of rows rows of typed placeholders, "SELECT
// CAST(? AS SIGNED) AS seq, … UNION ALL SELECT …", for write-backs that carry a value per
// row: the optimizer joins it to the outbox's primary key. (One JSON argument read with
// JSON_TABLE would keep the statement constant, but a table function in a multi-table
// UPDATE is not something every MySQL and MariaDB version is known to accept; a derived
// table is.) Each column is "name type" with type SIGNED or CHAR.
func mysqlRowsSQL(rows int, cols ...string) string {
	named := make([]string, len(cols))
	typed := make([]string, len(cols))
	for i, c := range cols {
		name, typ, _ := strings.Cut(c, " ")
		typed[i] = "CAST(? AS " + typ + ")"
		named[i] = typed[i] + " AS " + name
	}
	return repeatSQL("SELECT "+strings.Join(named, ", "), " UNION ALL SELECT "+strings.Join(typed, ", "), "", rows-1)
}
