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
--    first looks without it (the window) and queues only if it sees a free keyless row or
--    a free head there, or, past a full window, in step 4; once the lock is its own, it
--    starts again from step 3 (what it saw is stale: the claim before it leased rows).
-- 3. The window: the first 2 × p_limit rows in seq order (one index range), or 4 × on a
--    connection whose last claims found less than 3/4 of a claim in a full window (few
--    keys: the runs of the keys a concurrent claim holds fill its front; set back to 2 ×
--    after 32 claims that the wide window filled). Its free keyless rows and the runs of its
--    keys, oldest first, the runs of the older half of its keys before the others, leaving
--    those to a concurrent claim. Leased FOR UPDATE SKIP LOCKED: under the lock a keyed row
--    can be held only by Complete, and a row it holds was delivered, so a later row of its
--    key may go (a keyless row may be held by a claim of step 1 as well). Rows are updated
--    by their place in the heap (ctid), read and locked in the same statement.
-- 4. A full window that did not fill the claim (every key there is in flight, few keys,
--    or keyless rows in front): keyless rows beyond it come from their own index, and the
--    heads of keys from a loose index scan over (key, seq), one descent per key, from a
--    random key near the front, wrapping around, at most 4 × (p_limit - claimed) keys.
--    Each free head gives its run, read again under the lock; as in step 3 the runs of the
--    older half of the keys go first, (p_limit - claimed) / (keys / 2) deep, so a claim
--    that took a few rows of every key does not leave a concurrent claim none. A run that
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
    -- The window's width (step 3) adapts to the outbox: see there.
    v_guc     text := 'txoutbox.claim_window_' || translate(({{.LockKey}})::text, '-', 'n');
    v_wide    integer := coalesce(nullif(current_setting(v_guc, true), '')::integer, 0);
    v_window  integer := CASE WHEN v_wide > 0 THEN 4 ELSE 2 END * p_limit;
    v_locked  boolean;
    v_keyed   boolean;
    v_n       integer := 0;
    v_start   text;
    v_keys    text[];
    v_heads   bigint[];
    v_half    integer;
    v_short   boolean := false;
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
      -- (An earlier row of a key in the window is in the window: the probe starts at the
      -- outbox's first row, not at the deleted rows before it that vacuum has not removed.)
      IF EXISTS (
           SELECT 1 FROM (SELECT o.seq, o.key, o.available_at <= now() AND (o.lease_until IS NULL OR o.lease_until <= now()) AS free
                            FROM {{.Outbox}} AS o ORDER BY o.seq LIMIT v_window) AS w
            WHERE w.free AND (w.key = '' OR NOT EXISTS (
                    SELECT 1 FROM {{.Outbox}} AS p
                     WHERE p.key = w.key AND p.key <> '' AND p.seq < w.seq
                       AND p.seq >= (SELECT f.seq FROM {{.Outbox}} AS f ORDER BY f.seq LIMIT 1)))) THEN
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
    LOOP
        IF v_locked THEN
            RETURN QUERY
            WITH w AS MATERIALIZED (
                SELECT o.ctid, o.seq, o.key, o.available_at <= now() AND (o.lease_until IS NULL OR o.lease_until <= now()) AS free
                  FROM {{.Outbox}} AS o
                 ORDER BY o.seq
                 LIMIT v_window),
            -- Each key of the window with a run: its first seq (head) and the seq of its first
            -- row that is not free (stop, or none); its run is its rows before stop. The keys
            -- whose head is at most the median head (the older half) go first, so that a
            -- concurrent claim finds keys of its own instead of waiting for this one's.
            -- (Aggregates, not window functions over every row or over the keys: this runs
            -- under the lock.)
            k AS (
                SELECT w.key, min(w.seq) AS head,
                       coalesce(min(w.seq) FILTER (WHERE NOT w.free), 9223372036854775807) AS stop
                  FROM w WHERE w.key <> '' GROUP BY w.key
                HAVING min(w.seq) < coalesce(min(w.seq) FILTER (WHERE NOT w.free), 9223372036854775807)),
            c AS (
                SELECT w.ctid FROM w LEFT JOIN k ON k.key = w.key
                 WHERE CASE WHEN w.key = '' THEN w.free ELSE w.seq < k.stop END
                 ORDER BY w.key <> '' AND k.head > (SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY m.head) FROM k AS m), w.seq
                 LIMIT p_limit)
            UPDATE {{.Outbox}} AS o
               SET claim_token = p_token,
                   lease_owner = p_owner,
                   lease_until = now() + p_lease_ms * interval '1 millisecond',
                   attempts    = o.attempts + 1
             -- ARRAY(...) keeps the update on the rows' places in the heap (ctid); a join would
             -- hash the whole table. The locking subquery reads the window's places and returns
             -- those of the rows it locked (their latest versions), which stay put while locked.
             WHERE o.ctid = ANY (ARRAY(
                    SELECT x.ctid FROM {{.Outbox}} AS x
                     WHERE x.ctid = ANY (ARRAY(SELECT c.ctid FROM c))
                       AND x.available_at <= now() AND (x.lease_until IS NULL OR x.lease_until <= now())
                       FOR UPDATE SKIP LOCKED))
            RETURNING o.seq, o.id::text, o.type, o.key, coalesce(o.headers::text, ''), o.content_type,
                      o.body, o.created_at, o.attempts;
            GET DIAGNOSTICS v_n = ROW_COUNT;
            IF v_n >= p_limit THEN
                IF v_wide > 0 THEN
                    PERFORM set_config(v_guc, (v_wide - 1)::text, false);
                END IF;
                RETURN;
            END IF;
            v_short := v_n < p_limit * 3 / 4;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM {{.Outbox}} AS o ORDER BY o.seq OFFSET v_window - 1 LIMIT 1) THEN
            RETURN;
        END IF;
        IF v_short THEN
            PERFORM set_config(v_guc, '32', false);
        END IF;

        -- 4. A deep backlog that the window did not fill the claim from: its keys' heads are
        --    in flight, or there are few keys, or keyless rows fill the window. The heads of
        --    keys come from a loose index scan over (key, seq): one descent per key, from a
        --    random key near the front, wrapping around, at most 4 × (p_limit - claimed)
        --    keys; keyless rows beyond the window from their own index. Without the lock
        --    (another claim holds it) this only decides whether to queue for it.
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
            SELECT * FROM ((SELECT * FROM upper LIMIT 4 * (p_limit - v_n))
                           UNION ALL
                           (SELECT * FROM lower LIMIT 4 * (p_limit - v_n))) AS s
             LIMIT 4 * (p_limit - v_n)),
        heads AS (
            SELECT o.key, o.seq FROM scanned AS o
             WHERE (o.available_at <= now() AND (o.lease_until IS NULL OR o.lease_until <= now())) OR o.claim_token = p_token
             ORDER BY o.seq LIMIT p_limit - v_n)
        SELECT ARRAY(SELECT h.key FROM heads AS h ORDER BY h.seq),
               ARRAY(SELECT h.seq FROM heads AS h ORDER BY h.seq)
          INTO v_keys, v_heads;
        EXIT WHEN v_locked;
        IF cardinality(v_keys) = 0 AND NOT EXISTS (SELECT 1 FROM {{.Outbox}} AS o WHERE o.key = '' AND o.available_at <= now() AND (o.lease_until IS NULL OR o.lease_until <= now())) THEN
            RETURN;
        END IF;
        -- What the look saw is stale once the lock is ours (the claim that held it leased
        -- rows meanwhile): start again from the window, under the lock.
        PERFORM pg_advisory_xact_lock({{.LockKey}});
        v_locked := true;
    END LOOP;

    -- Each key whose head is free gives its run from the head (read again, under the lock);
    -- as in step 3, the runs of the older half of the keys go first, leaving the others to
    -- a concurrent claim (a claim that took a few rows of every key would leave it none),
    -- so runs are read (p_limit - claimed) / (keys / 2) deep. Within each half, runs are
    -- merged with keyless rows in waves. This claim's own leases from step 3 are visible
    -- here, and a run goes on after them (they are the first rows of its key): a key whose
    -- run the window cut short continues beyond it.
    v_half := greatest((cardinality(v_keys) + 1) / 2, 1);
    RETURN QUERY
    WITH c AS (
        (SELECT o.ctid, o.seq, false AS later, 1::bigint AS wave
           FROM {{.Outbox}} AS o
          WHERE o.key = '' AND o.available_at <= now() AND (o.lease_until IS NULL OR o.lease_until <= now())
          ORDER BY o.seq
          LIMIT p_limit - v_n)
        UNION ALL
        SELECT r.ctid, r.seq, k.rank > v_half, r.wave
          FROM unnest(v_keys, v_heads) WITH ORDINALITY AS k(key, head, rank)
         CROSS JOIN LATERAL (
            SELECT x.ctid, x.seq, x.wave FROM (
                SELECT o.ctid, o.seq, row_number() OVER (ORDER BY o.seq) AS wave,
                       bool_and(o.available_at <= now() AND (o.lease_until IS NULL OR o.lease_until <= now())) OVER (ORDER BY o.seq) AS run
                  FROM (SELECT o.ctid, o.seq, o.available_at, o.lease_until
                          FROM {{.Outbox}} AS o
                         WHERE o.key = k.key AND o.key <> '' AND o.seq >= k.head
                           AND o.claim_token IS DISTINCT FROM p_token
                         ORDER BY o.seq
                         LIMIT (p_limit - v_n + v_half - 1) / v_half) AS o) AS x
             WHERE x.run) AS r
         ORDER BY later, wave, seq
         LIMIT p_limit - v_n)
    UPDATE {{.Outbox}} AS o
       SET claim_token = p_token,
           lease_owner = p_owner,
           lease_until = now() + p_lease_ms * interval '1 millisecond',
           attempts    = o.attempts + 1
     -- By ctid, as in step 3.
     WHERE o.ctid = ANY (ARRAY(
            SELECT x.ctid FROM {{.Outbox}} AS x
             WHERE x.ctid = ANY (ARRAY(SELECT c.ctid FROM c))
               AND x.available_at <= now() AND (x.lease_until IS NULL OR x.lease_until <= now())
               FOR UPDATE SKIP LOCKED))
    RETURNING o.seq, o.id::text, o.type, o.key, coalesce(o.headers::text, ''), o.content_type,
              o.body, o.created_at, o.attempts;
END
$fn$;
