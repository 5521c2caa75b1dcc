package sqlstore

import (
	"context"
	"math/rand/v2"

	"github.com/txoutbox/outbox/outboxdriver"
)

// pgStore is PostgreSQL's relay store. Its claim and complete are the functions of
// migrations 004 and 001, one round trip each; the write-backs that keep or move rows run
// under the claims' locks (fence).
type pgStore struct {
	db DB
	n  *Names
}

func (s *pgStore) Stats(ctx context.Context) (outboxdriver.Stats, error) {
	return readStats(ctx, s.db, s.n)
}

// Claim calls the claim function with the loop's state as its arguments (postgres_claim.go),
// and learns from the rows it returns how to call the next claim of the loop.
func (s *pgStore) Claim(ctx context.Context, p outboxdriver.ClaimParams) ([]outboxdriver.Claimed, error) {
	loop := pgLoopOf(p.State)
	window, probe, backlog := loop.args(p.Limit)
	// The columns by name: a claim function of an older migration 004 fails as a schema to
	// migrate, not as a scan that does not fit.
	rows, err := s.db.Query(ctx, "SELECT "+claimColumns+", step FROM "+s.n.ClaimFunc+"($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
		p.Owner, p.Token, p.Limit, p.Lease.Milliseconds(), p.Lane, p.Lanes, window, probe, backlog, rand.Float64())
	if err != nil {
		return nil, err
	}
	var (
		step  int16
		steps pgClaimSteps
	)
	claimed, err := scanClaimed(rows, p.Limit, backlog, func() { steps.count(step) }, &step)
	if err != nil {
		return nil, err
	}
	loop.learn(p.Limit, steps)
	return claimed, nil
}

// Complete deletes delivered rows. It needs no fence: a row it deletes was delivered, so a
// later event of its key may go (docs/ordering.md, O5).
func (s *pgStore) Complete(ctx context.Context, token int64, seqs []int64) error {
	return s.db.Exec(ctx, "SELECT "+s.n.CompleteFunc+"($1, string_to_array($2, ',')::bigint[])", token, joinSeqs(seqs))
}

func (s *pgStore) Retry(ctx context.Context, token int64, retries []outboxdriver.Retry) error {
	return s.db.Exec(ctx, s.fence()+`
UPDATE `+s.n.Outbox+` AS o
   SET available_at = now() + r.delay_ms * interval '1 millisecond',
       last_error = r.error,
       first_failed_at = coalesce(o.first_failed_at, now()),
       claim_token = NULL, lease_owner = NULL, lease_until = NULL
  FROM jsonb_to_recordset($2::jsonb) AS r(seq bigint, delay_ms bigint, error text)
 WHERE o.seq = r.seq AND o.claim_token = $1 AND EXISTS (SELECT FROM fence)`, token, jsonRetries(retries, pgSQL.lim))
}

// DeadLetter moves the rows to the dead-letter table in one transaction: the delete returns
// them, and they are inserted made storable (see dlWriter.moveDeadLetters). The rows of dead
// letters with HoldKey are not deleted but held (see hold.go): due never, leased by none,
// where they stand. Under the fence, like Retry: a claim sees the row leased or held,
// never in between.
func (s *pgStore) DeadLetter(ctx context.Context, token int64, dead []outboxdriver.DeadLetter) ([]int64, error) {
	if len(dead) == 0 {
		return nil, nil
	}
	hold, drop := holdSplit(dead)
	const failed = `o.seq, o.id::text, o.type, o.key, coalesce(o.headers::text, ''), o.content_type, o.body,
          o.created_at, o.attempts, coalesce(o.first_failed_at, now()), now()`
	w := dlWriter{sql: pgSQL, table: s.n.DeadLetters}
	return w.moveDeadLetters(ctx, s.db, dead, func(ctx context.Context, q Querier) ([]failedRow, error) {
		rows, err := q.Query(ctx, s.fence()+`,
held AS (
UPDATE `+s.n.Outbox+` AS o
   SET available_at = `+pgSQL.heldAt+`, claim_token = NULL, lease_owner = NULL, lease_until = NULL
 WHERE o.claim_token = $1 AND o.seq = ANY (string_to_array($2, ',')::bigint[]) AND o.key <> ''
   AND EXISTS (SELECT FROM fence)
RETURNING `+failed+`, true),
gone AS (
DELETE FROM `+s.n.Outbox+` AS o
 WHERE o.claim_token = $1 AND (o.seq = ANY (string_to_array($3, ',')::bigint[])
                               OR o.seq = ANY (string_to_array($2, ',')::bigint[]) AND o.key = '')
   AND EXISTS (SELECT FROM fence)
RETURNING `+failed+`, false)
SELECT * FROM held UNION ALL SELECT * FROM gone`, token, joinSeqs(hold), joinSeqs(drop))
		if err != nil {
			return nil, err
		}
		return scanFailed(rows, true)
	})
}

func (s *pgStore) Release(ctx context.Context, token int64, seqs []int64) error {
	return s.db.Exec(ctx, s.fence()+`
UPDATE `+s.n.Outbox+`
   SET claim_token = NULL, lease_owner = NULL, lease_until = NULL, attempts = attempts - 1
 WHERE claim_token = $1 AND seq = ANY (string_to_array($2, ',')::bigint[]) AND EXISTS (SELECT FROM fence)`, token, joinSeqs(seqs))
}

// fence starts a write-back that leaves a row in the outbox (Retry, Release) or moves it out
// on failure (DeadLetter) with all the claims' advisory locks in shared mode (the function
// of migration 004): write-backs do not wait for each other, but no claim runs while one is
// in flight (docs/ordering.md, O6). Otherwise a relay whose lease expired could be
// rescheduling its row X while another relay claims: the claim skips the locked X (or sees
// it change under its lock) and takes Y, the next event of X's key, which would then
// overtake X. The uncorrelated EXISTS (SELECT FROM fence) is a one-time filter, so the
// locks are taken before any row is read.
func (s *pgStore) fence() string {
	return "WITH fence AS MATERIALIZED (SELECT " + s.n.WriteBacks + "())"
}
