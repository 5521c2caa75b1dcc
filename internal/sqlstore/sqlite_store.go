package sqlstore

import (
	"context"
	"fmt"

	"github.com/txoutbox/outbox/outboxdriver"
)

// sqliteStore is SQLite's relay store: its claim (below, with runs.go), the write-backs that
// carry a value per row, and those it shares with MySQL (leasestore.go).
type sqliteStore struct{ leaseStore }

func newSQLiteStore(db DB, n *Names) *sqliteStore {
	s := &sqliteStore{leaseStore{db: db, n: n, sql: sqliteSQL}}
	// A recursive query that steps from key to key through the (key, seq) index.
	s.heads = func(upper bool) string {
		bound := `"key" >= ?1`
		if !upper {
			bound = `"key" < ?1`
		}
		return `WITH RECURSIVE ks(k) AS (
    SELECT (SELECT "key" FROM ` + n.Outbox + ` WHERE ` + bound + ` AND "key" <> '' ORDER BY "key" LIMIT 1)
    UNION ALL
    SELECT (SELECT "key" FROM ` + n.Outbox + ` WHERE "key" > ks.k AND ` + bound + ` AND "key" <> '' ORDER BY "key" LIMIT 1)
      FROM ks WHERE ks.k IS NOT NULL
    LIMIT ?2)
SELECT o.seq, o."key", ` + s.free("o") + `
  FROM ks JOIN ` + n.Outbox + ` AS o
    ON o.seq = (SELECT min(seq) FROM ` + n.Outbox + ` WHERE "key" = ks.k AND "key" <> '')`
	}
	return s
}

// Claim leases with one UPDATE ... RETURNING (atomic: a write statement takes the database's
// write lock before it reads). An outbox without keyed rows is a plain queue: the oldest
// free rows. Otherwise the claim is planned (planClaim) with plain reads, and the planned
// rows still free are leased; a planned row that is gone or no longer free (another relay
// claimed it since the plan, or a write-back changed it) ends its key's run, and the rows
// leased after it are given back at once (keepRuns). Why this keeps each key's order:
// docs/ordering.md.
func (s *sqliteStore) Claim(ctx context.Context, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	onlyKeyless, err := s.onlyKeyless(ctx, s.db)
	if err != nil {
		return nil, err
	}
	var (
		plan  []claimCandidate
		which = "seq IN (SELECT seq FROM " + s.n.Outbox + " WHERE " + s.oldestKeyless(p.Limit) + ")"
	)
	if !onlyKeyless {
		if plan, err = s.planClaim(ctx, s.db, p.Limit, claimWindow(p.Limit)); err != nil || len(plan) == 0 {
			return nil, err
		}
		which = inSeqs(candidateSeqs(plan))
	}
	rows, err := s.db.Query(ctx, `UPDATE `+s.n.Outbox+`
   SET claim_token = ?, lease_owner = ?,
       lease_until = strftime('%Y-%m-%d %H:%M:%f', 'now', ?),
       attempts = attempts + 1
 WHERE `+which+` AND `+s.free("")+`
RETURNING seq, id, type, "key", `+s.sql.headers+`, content_type, body, created_at, attempts, first_failed_at`,
		p.Token, p.Owner, fmt.Sprintf("%+.3f seconds", p.Lease.Seconds()))
	if err != nil {
		return nil, err
	}
	leased, err := scanClaimed(rows, p.Limit, false, nil) // no loop state: grows from its first row
	if err != nil || onlyKeyless {
		return leased, err
	}
	kept, giveBack := keptRuns(plan, leased)
	if len(giveBack) > 0 {
		if err := s.Release(ctx, p.Token, giveBack); err != nil {
			return nil, fmt.Errorf("giving back rows behind a run that changed: %w", err)
		}
	}
	return kept, nil
}

// Retry records each error made storable (a broker's error text may hold anything).
func (s *sqliteStore) Retry(ctx context.Context, token int64, retries []outboxdriver.Retry) error {
	if len(retries) == 0 {
		return nil
	}
	return s.db.Exec(ctx, `UPDATE `+s.n.Outbox+` AS o
   SET available_at = strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', r.delay_ms / 1000.0)),
       last_error = r.msg,
       first_failed_at = COALESCE(o.first_failed_at, `+sqliteNow+`),
       claim_token = NULL, lease_owner = NULL, lease_until = NULL
  FROM (SELECT json_extract(value, '$.seq') AS seq,
               json_extract(value, '$.delay_ms') AS delay_ms,
               json_extract(value, '$.error') AS msg
          FROM json_each(?)) AS r
 WHERE o.seq = r.seq AND o.claim_token = ?`, jsonRetries(retries, s.sql.lim), token)
}

// DeadLetter moves the rows to the dead-letter table in one transaction (leaseStore). UPDATE
// or DELETE ... RETURNING takes the write lock first, so the rows read are the rows held or
// deleted.
func (s *sqliteStore) DeadLetter(ctx context.Context, token int64, dead []outboxdriver.DeadLetter) ([]int64, error) {
	return s.deadLetters(ctx, dead, func(ctx context.Context, q Querier, hold, drop []int64) ([]failedRow, error) {
		returning := " RETURNING " + s.failedColumns()
		var taken []failedRow
		if len(hold) > 0 {
			rows, err := q.Query(ctx, s.holdRows(hold)+returning, token)
			if err != nil {
				return nil, err
			}
			if taken, err = scanFailed(rows, false); err != nil {
				return nil, err
			}
			for i := range taken {
				taken[i].held = true
			}
		}
		// The keyless rows of hold are not held: deleted, as the others.
		rows, err := q.Query(ctx, "DELETE FROM "+s.n.Outbox+" WHERE claim_token = ? AND ("+inSeqs(drop)+
			" OR "+s.sql.key+" = '' AND "+inSeqs(hold)+")"+returning, token)
		if err != nil {
			return nil, err
		}
		gone, err := scanFailed(rows, false)
		return append(taken, gone...), err
	})
}
