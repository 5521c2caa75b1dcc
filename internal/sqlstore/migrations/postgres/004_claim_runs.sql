-- Claims whose cost depends on the batch and the number of keys, never on the depth of the
-- backlog.
--
-- The claim of 001 scanned the outbox in seq order and, for every row, walked the earlier
-- rows of its key looking for one leased or waiting. With few keys and a deep backlog every
-- key soon has a leased first row, so each claim walked the whole backlog to return
-- nothing, holding the claim lock meanwhile (10 keys × 10k events: ~500 events/s).

-- Keyless rows in outbox order, for claims that look past a window of keyed rows.
CREATE INDEX IF NOT EXISTS {{idx "keyless_seq_idx"}} ON {{.Outbox}} (seq) WHERE key = '';

-- Claim leases up to p_limit due rows: keyless ones, and whole runs of keys. A key's run is
-- its rows in seq order from its first (its head: the lowest seq this claim can see) up to,
-- not including, the first one that is leased or waiting for a retry; a key whose head is
-- leased or waiting gives nothing. So no row is claimed while an earlier row of its key is
-- in flight or waiting, with any number of relays, and a row whose transaction commits late
-- (Watermill #311) is its key's head once it is visible: claimed then, never skipped.
--
-- 1. An outbox with no keyed row at all (one probe of the keyed index) is a plain queue:
--    the oldest free rows, FOR UPDATE SKIP LOCKED, without the lock below. Keyless rows
--    have no order to keep, and this claim leases keyless rows only, so concurrent claims
--    of a keyless outbox run in parallel, each skipping the rows the others hold.
-- 2. Claims of keyed rows are serialised by a transaction-scoped advisory lock, so each
--    sees every lease committed before it; write-backs that keep or move rows (Retry,
--    Release, DeadLetter) hold it in shared mode, so no claim reads a run while a relay
--    whose lease expired is rescheduling a row of it. A claim that finds the lock taken
--    first looks without it (the first 2 × p_limit rows) and queues only if it sees a
--    free keyless row or a free head there, or, past a full window, in step 4.
-- 3. The window: the first 2 × p_limit rows in seq order (one index range). Its free
--    keyless rows and the runs of its keys, oldest first, the runs of the older half of
--    its keys before the others, leaving those to a concurrent claim. Leased
--    FOR UPDATE SKIP LOCKED: under the lock a keyed row can be held only by Complete, and
--    a row it holds was delivered, so a later row of its key may go (a keyless row may be
--    held by a claim of step 1 as well).
-- 4. A full window that did not fill the claim (every key there is in flight, few keys,
--    or keyless rows in front): keyless rows beyond it come from their own index, and the
--    heads of keys from a loose index scan over (key, seq), one descent per key, from a
--    random key near the front, wrapping around, at most 4 × p_limit keys. Each free head
--    gives its run, (p_limit - claimed) / keys deep, read again under the lock; a run that
--    the window cut short goes on beyond it.
--
-- The relay's own commits may be lost on a crash without losing events (only re-sending
-- them), so they skip the WAL flush.
CREATE OR REPLACE FUNCTION {{.ClaimFunc}}(p_owner text, p_token bigint, p_limit integer, p_lease_ms bigint)
RETURNS TABLE (seq bigint, id text, type text, key text, headers text, content_type text,
               body bytea, created_at timestamptz, attempts integer)
LANGUAGE plpgsql
-- JIT compiling these small, frequent queries costs far more than it saves, and so does
-- planning them anew on every call (their best plans do not depend on the arguments).
-- Every query here is an index range or probe whose cost is bounded by the batch and the
-- number of keys; with no table statistics (a new deployment before autoanalyze, or
-- autovacuum off) the planner would pick sequential scans and sorts of the whole backlog
-- instead, so those are ruled out rather than left to statistics.
SET jit = off
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $fn$
#variable_conflict use_column
DECLARE
    v_window  integer := 2 * p_limit;
    v_locked  boolean;
    v_keyed   boolean;
    v_n       integer := 0;
    v_start   text;
    v_keys    text[];
    v_heads   bigint[];
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);

    -- 1. No keyed row in the outbox (one probe of the keyed index): keyless rows need no
    --    order, so the claim is the plain SKIP LOCKED queue read, without the lock. (Steps
    --    1, 3 and 4 each have their own lease statement: one statement with a branch per
    --    case measured ~150 µs more per claim, the executor setting up every branch's plan
    --    each time.) The rows are updated by their place in the heap (ctid), read and
    --    locked in this statement: no second descent of the primary key per row.
    v_keyed := EXISTS (SELECT 1 FROM {{.Outbox}} AS o WHERE o.key <> '');
    IF NOT v_keyed THEN
        RETURN QUERY
        UPDATE {{.Outbox}} AS o
           SET claim_token = p_token,
               lease_owner = p_owner,
               lease_until = now() + p_lease_ms * interval '1 millisecond',
               attempts    = o.attempts + 1
         WHERE o.ctid = ANY (ARRAY(
                SELECT x.ctid FROM {{.Outbox}} AS x
                 WHERE x.key = '' AND x.available_at <= now() AND (x.lease_until IS NULL OR x.lease_until <= now())
                 ORDER BY x.seq
                 LIMIT p_limit
                   FOR UPDATE SKIP LOCKED))
        RETURNING o.seq, o.id::text, o.type, o.key, coalesce(o.headers::text, ''), o.content_type,
                  o.body, o.created_at, o.attempts;
        RETURN;
    END IF;

    -- 2. The lock. If another claim holds it, queue for it only if the window holds a free
    --    keyless row or a free head (a row with no earlier row of its key).
    v_locked := pg_try_advisory_xact_lock({{.LockKey}});
    IF NOT v_locked THEN
      IF EXISTS (
           SELECT 1 FROM (SELECT o.seq, o.key, o.available_at <= now() AND (o.lease_until IS NULL OR o.lease_until <= now()) AS free
                            FROM {{.Outbox}} AS o ORDER BY o.seq LIMIT v_window) AS w
            WHERE w.free AND (w.key = '' OR NOT EXISTS (
                    SELECT 1 FROM {{.Outbox}} AS p WHERE p.key = w.key AND p.key <> '' AND p.seq < w.seq))) THEN
        PERFORM pg_advisory_xact_lock({{.LockKey}});
        v_locked := true;
      END IF;
    END IF;

    -- 3. The window: the first 2 × p_limit rows. Its free keyless rows and the runs of its
    --    keys (each key's rows from its first one, while they are free), oldest first, the
    --    older half of the keys before the other. Under the lock, only Complete can hold a
    --    keyed row (one it is deleting after delivery), so SKIP LOCKED never lets a row
    --    overtake one of its key that is still to be sent. (A claim of step 1 that saw no
    --    keyed row may hold keyless ones.)
    IF v_locked THEN
        RETURN QUERY
        WITH w AS MATERIALIZED (
            SELECT o.ctid, o.seq, o.key, o.available_at <= now() AND (o.lease_until IS NULL OR o.lease_until <= now()) AS free
              FROM {{.Outbox}} AS o
             ORDER BY o.seq
             LIMIT v_window),
        -- Each key of the window: its first seq (head) and the seq of its first row that is
        -- not free (stop, or none); its run is its rows before stop. Keys are ranked by
        -- head: the older half goes first, so that a concurrent claim finds keys of its own
        -- instead of waiting for this one's. (Aggregates, not window functions over every
        -- row: half the time, and this runs under the lock.)
        k AS (
            SELECT w.key, min(w.seq) AS head,
                   coalesce(min(w.seq) FILTER (WHERE NOT w.free), 9223372036854775807) AS stop
              FROM w WHERE w.key <> '' GROUP BY w.key),
        r AS (
            SELECT k.key, k.stop, row_number() OVER (ORDER BY k.head) AS rank, count(*) OVER () AS keys
              FROM k WHERE k.head < k.stop),
        c AS (
            SELECT w.ctid FROM w LEFT JOIN r ON r.key = w.key
             WHERE CASE WHEN w.key = '' THEN w.free ELSE w.seq < r.stop END
             ORDER BY w.key <> '' AND r.rank > (r.keys + 1) / 2, w.seq
             LIMIT p_limit)
        UPDATE {{.Outbox}} AS o
           SET claim_token = p_token,
               lease_owner = p_owner,
               lease_until = now() + p_lease_ms * interval '1 millisecond',
               attempts    = o.attempts + 1
         -- ARRAY(...) keeps the update on the primary key; a join would hash the whole table.
         -- The rows are locked by their place in the heap (ctid), read in this statement.
         WHERE o.seq = ANY (ARRAY(
                SELECT x.seq FROM {{.Outbox}} AS x
                 WHERE x.ctid = ANY (ARRAY(SELECT c.ctid FROM c))
                   AND x.available_at <= now() AND (x.lease_until IS NULL OR x.lease_until <= now())
                   FOR UPDATE SKIP LOCKED))
        RETURNING o.seq, o.id::text, o.type, o.key, coalesce(o.headers::text, ''), o.content_type,
                  o.body, o.created_at, o.attempts;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    IF v_n >= p_limit OR NOT EXISTS (SELECT 1 FROM {{.Outbox}} AS o ORDER BY o.seq OFFSET v_window - 1 LIMIT 1) THEN
        RETURN;
    END IF;

    -- 4. A deep backlog that the window did not fill the claim from: its keys' heads are
    --    in flight, or there are few keys, or keyless rows fill the window. The heads of
    --    keys come from a loose index scan over (key, seq): one descent per key, from a
    --    random key near the front, wrapping around, at most 4 × p_limit keys; keyless rows
    --    beyond the window from their own index. Without the lock (another claim holds
    --    it) this only decides whether to queue for it.
    v_start := coalesce((SELECT o.key FROM {{.Outbox}} AS o WHERE o.key <> '' AND o.seq = ANY (ARRAY(
                            SELECT x.seq FROM {{.Outbox}} AS x ORDER BY x.seq
                            OFFSET floor(random() * v_window) LIMIT 1))), '');
    WITH RECURSIVE
    upper AS (
        (SELECT o.key, o.seq, o.available_at, o.lease_until, o.claim_token
           FROM {{.Outbox}} AS o
          WHERE o.key >= v_start AND o.key <> ''
          ORDER BY o.key, o.seq LIMIT 1)
        UNION ALL
        SELECT n.* FROM upper AS h CROSS JOIN LATERAL (
            SELECT o.key, o.seq, o.available_at, o.lease_until, o.claim_token
              FROM {{.Outbox}} AS o
             WHERE o.key > h.key AND o.key <> ''
             ORDER BY o.key, o.seq LIMIT 1) AS n),
    lower AS (
        (SELECT o.key, o.seq, o.available_at, o.lease_until, o.claim_token
           FROM {{.Outbox}} AS o
          WHERE o.key < v_start AND o.key <> ''
          ORDER BY o.key, o.seq LIMIT 1)
        UNION ALL
        SELECT n.* FROM lower AS h CROSS JOIN LATERAL (
            SELECT o.key, o.seq, o.available_at, o.lease_until, o.claim_token
              FROM {{.Outbox}} AS o
             WHERE o.key > h.key AND o.key < v_start AND o.key <> ''
             ORDER BY o.key, o.seq LIMIT 1) AS n),
    scanned AS (
        SELECT * FROM ((SELECT * FROM upper LIMIT 4 * p_limit)
                       UNION ALL
                       (SELECT * FROM lower LIMIT 4 * p_limit)) AS s
         LIMIT 4 * p_limit),
    heads AS (
        SELECT o.key, o.seq FROM scanned AS o
         WHERE (o.available_at <= now() AND (o.lease_until IS NULL OR o.lease_until <= now())) OR o.claim_token = p_token
         ORDER BY o.seq LIMIT p_limit - v_n)
    SELECT ARRAY(SELECT h.key FROM heads AS h ORDER BY h.seq),
           ARRAY(SELECT h.seq FROM heads AS h ORDER BY h.seq)
      INTO v_keys, v_heads;
    IF NOT v_locked THEN
        IF cardinality(v_keys) = 0 AND NOT EXISTS (SELECT 1 FROM {{.Outbox}} AS o WHERE o.key = '' AND o.available_at <= now() AND (o.lease_until IS NULL OR o.lease_until <= now())) THEN
            RETURN;
        END IF;
        PERFORM pg_advisory_xact_lock({{.LockKey}});
    END IF;

    -- Each key whose head is free gives its run from the head (read again, under the lock),
    -- (p_limit - claimed) / keys deep; merged with keyless rows in waves. This claim's own
    -- leases from step 3 are visible here, and a run goes on after them (they are the first
    -- rows of its key): a key whose run the window cut short continues beyond it.
    RETURN QUERY
    WITH c AS (
        (SELECT o.seq, 1::bigint AS wave
           FROM {{.Outbox}} AS o
          WHERE o.key = '' AND o.available_at <= now() AND (o.lease_until IS NULL OR o.lease_until <= now())
          ORDER BY o.seq
          LIMIT p_limit - v_n)
        UNION ALL
        SELECT r.seq, r.wave
          FROM unnest(v_keys, v_heads) AS k(key, head)
         CROSS JOIN LATERAL (
            SELECT x.seq, x.wave FROM (
                SELECT o.seq, row_number() OVER (ORDER BY o.seq) AS wave,
                       bool_and(o.available_at <= now() AND (o.lease_until IS NULL OR o.lease_until <= now())) OVER (ORDER BY o.seq) AS run
                  FROM (SELECT o.seq, o.available_at, o.lease_until
                          FROM {{.Outbox}} AS o
                         WHERE o.key = k.key AND o.key <> '' AND o.seq >= k.head
                           AND o.claim_token IS DISTINCT FROM p_token
                         ORDER BY o.seq
                         LIMIT (p_limit - v_n + cardinality(v_keys) - 1) / greatest(cardinality(v_keys), 1)) AS o) AS x
             WHERE x.run) AS r
         ORDER BY wave, seq
         LIMIT p_limit - v_n)
    UPDATE {{.Outbox}} AS o
       SET claim_token = p_token,
           lease_owner = p_owner,
           lease_until = now() + p_lease_ms * interval '1 millisecond',
           attempts    = o.attempts + 1
     -- ARRAY(...) keeps the update on the primary key; a join would hash the whole table.
     WHERE o.seq = ANY (ARRAY(
            SELECT x.seq FROM {{.Outbox}} AS x
             WHERE x.seq = ANY (ARRAY(SELECT c.seq FROM c))
               AND x.available_at <= now() AND (x.lease_until IS NULL OR x.lease_until <= now())
               FOR UPDATE SKIP LOCKED))
    RETURNING o.seq, o.id::text, o.type, o.key, coalesce(o.headers::text, ''), o.content_type,
              o.body, o.created_at, o.attempts;
END
$fn$;
