-- The relay's claim: up to p_limit free rows, keyless ones and whole runs of keys, at a cost
-- that follows the batch and the number of keys, never the depth of the backlog.
--
-- Why no row is claimed while an earlier row of its key is leased, waiting or held — with
-- several relays, late commits and stale write-backs — is argued once, step by step, in
-- docs/ordering.md ("The argument"); the comments below cite its rules as (O1)…(O8). Two
-- of them need no statement of their own: a held row (a dead letter's, available_at
-- 'infinity') is a row that is never free, so every step below ends its key's run there (O7);
-- and no claim keeps a cursor, each reads from the outbox's first row and each key's first
-- row, so a row that commits late is taken once visible, never skipped (O8).
--
-- The claim depends only on its arguments and the table. What a relay loop learns from its
-- claims (whether they come back full, how wide a window finds enough) is kept by the Go
-- store per loop (postgres_claim.go) and passed in; nothing here reads or writes session
-- settings but the transaction's synchronous_commit.
--
-- Tuning after a release: most knobs are arguments (the window's width, whether to probe for
-- keyed rows, whether the loop is in a backlog, where step 4 starts), so changing them is a
-- Go change and no migration. A change of the SQL ships as one small new migration that
-- replaces the function it changes whole, CREATE OR REPLACE with the same arguments (running
-- relays of the previous release keep calling it); new arguments add a new overload, and the
-- old one is dropped a release later. The helper functions (is_free, the locks) are
-- separate so that such a migration replaces only what it changes.

-- Keyless rows in outbox order: step 1, and keyless rows beyond the window in step 4.
CREATE INDEX IF NOT EXISTS {{idx "keyless_seq_idx"}} ON {{.Outbox}} (seq) WHERE key = '';

-- A row is free when it is due and no lease holds it (O1). The one definition: every
-- statement of the claim asks it. A plain SQL expression, which the planner inlines.
CREATE FUNCTION {{.IsFree}}(p_available_at timestamptz, p_lease_until timestamptz)
RETURNS boolean
LANGUAGE sql
STABLE
AS $fn$
    SELECT p_available_at <= now() AND (p_lease_until IS NULL OR p_lease_until <= now())
$fn$;

-- Takes the claims' advisory locks of the key partitions in p_want (bit p: partition p),
-- without waiting for any, and returns the set it holds; with p_first a partition (not -1),
-- it waits for that one's lock first. The lock of partition p is the outbox's lock key XOR
-- (p + 1); the key itself is the lock of all keys (O3).
CREATE FUNCTION {{.ClaimLocks}}(p_want integer, p_first integer)
RETURNS integer
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_held integer := 0;
BEGIN
    IF p_first >= 0 THEN
        PERFORM pg_advisory_xact_lock(({{.LockKey}})::bigint # (p_first + 1));
        v_held := 1 << p_first;
    END IF;
    SELECT v_held | coalesce(bit_or(1 << p), 0) INTO v_held
      FROM generate_series(0, 15) AS p
     -- CASE: the lock is tried only for the partitions wanted.
     WHERE CASE WHEN p_want & (1 << p) <> 0 AND p <> p_first
                THEN pg_try_advisory_xact_lock(({{.LockKey}})::bigint # (p + 1)) ELSE false END;
    RETURN v_held;
END
$fn$;

-- Takes all the claims' locks in shared mode, in order, waiting for each: the lock of all
-- keys, then those of the 16 partitions. Write-backs that keep or move rows (Retry, Release,
-- DeadLetter) hold them, so that no claim runs beside one (O6).
CREATE FUNCTION {{.WriteBacks}}()
RETURNS void
LANGUAGE plpgsql
AS $fn$
BEGIN
    PERFORM count(pg_advisory_xact_lock_shared(({{.LockKey}})::bigint # p)) FROM generate_series(0, 16) AS p;
END
$fn$;

-- The claim, in five steps; each step that picks rows hands their places in the heap (ctid)
-- to the one lease statement at the end of the loop:
--
-- 1. An outbox with no keyed row (one probe of the keyed index; skipped when p_probe is
--    false, while the loop's claims come back full of keyed work) is a plain queue: the
--    oldest free keyless rows, FOR UPDATE SKIP LOCKED, without the locks. Concurrent claims
--    of a keyless outbox run side by side, each skipping the rows the others hold (O2).
-- 2. The locks (O3). A claim of a relay of one loop (p_lanes 1), or of a loop whose last
--    claim was not full (p_backlog false: at low load one loop polls), takes the lock of all
--    keys alone if it is free: one lock, one pass. Otherwise it takes that lock shared, then
--    its loop's share of the 16 partitions (p % p_lanes = p_lane), or, if other claims hold
--    all of those, any that no claim holds: the loops claim side by side. A claim that got
--    no lock looks without one (steps 3 and 4, leasing nothing) and waits for one only if it
--    sees something to take; once it holds one it starts again from step 3 (what it saw is
--    stale: the claims before it leased rows).
-- 3. The window: the first p_window rows in seq order (one index range) that are keyless
--    or of a partition held; holding k of 16 partitions it reads at most min(16 / k, 4) ×
--    p_window rows of the outbox. Its free keyless rows and the runs of its keys (O4),
--    oldest first, the runs of the older half of the keys before the others, which are left
--    to a concurrent claim.
-- 4. Past a full window that did not fill the claim: keyless rows beyond it from their own
--    index, and the heads of keys from a loose index scan over (key, seq), one descent per
--    key, from the key of the window's row at p_start (a fraction), wrapping around, at
--    most 4 × (p_limit - claimed) keys. Each free head of a partition held gives its run,
--    read again under the lock; the runs of the older half of the keys first, (p_limit -
--    claimed) / (keys / 2) deep. A run that the window cut short goes on beyond it.
-- 5. Still not full: the partitions that no claim holds now are added, and steps 3 and 4
--    run again for their keys.
--
-- The rows come back with the step that leased them (1, 3 or 4): the Go store learns from
-- them how to call the next claim of the loop (postgres_claim.go). The relay's own commits
-- may be lost on a crash without losing events (only re-sending them), so they skip the WAL
-- flush.
CREATE FUNCTION {{.ClaimFunc}}(p_owner text, p_token bigint, p_limit integer, p_lease_ms bigint,
                               p_lane integer, p_lanes integer, p_window integer,
                               p_probe boolean, p_backlog boolean, p_start double precision)
RETURNS TABLE (seq bigint, id text, type text, key text, headers text, content_type text,
               body bytea, created_at timestamptz, attempts integer, first_failed_at timestamptz,
               step smallint)
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
    v_window  integer := greatest(p_window, 1);
    v_step    smallint := 3;     -- the step to run next
    v_pick    tid[];             -- the rows the step picked, for the lease statement
    -- The partitions (bit p: hashtext(key) & 15 = p) of this loop's share, the one to wait
    -- for, those of this pass of steps 3-4 (step 5 adds others; 0: no lock yet), and all held.
    v_share   integer := 0;
    v_first   integer := 0;
    v_held    integer := 0;
    v_all     integer;
    v_want    integer;
    v_shared  boolean := false;  -- the lock of all keys is held shared, not alone
    v_queue   boolean := false;  -- wait for a lock, then start again from step 3
    v_deep    boolean;           -- the window is full: there are rows beyond it
    v_free    integer := 0;      -- free work the window holds: bit p a head of partition p, bit 16 a keyless row
    v_more    integer;
    v_n       integer := 0;      -- rows claimed so far
    v_start   text;
    v_keys    text[];
    v_heads   bigint[];
    v_half    integer;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);

    IF p_probe AND NOT EXISTS (SELECT 1 FROM {{.Outbox}} AS o WHERE o.key <> '') THEN
        v_step := 1;
    ELSE
        -- 2. The locks.
        IF p_lanes <= 1 OR NOT p_backlog THEN
            IF pg_try_advisory_xact_lock({{.LockKey}}) THEN
                v_held := 65535;
            END IF;
        END IF;
        IF v_held = 0 THEN
            v_shared := pg_try_advisory_xact_lock_shared({{.LockKey}});
            IF v_shared THEN
                v_first := CASE WHEN p_lanes > 1 THEN abs(p_lane) % least(p_lanes, 16) ELSE 0 END;
                FOR v_p IN v_first..15 BY greatest(least(p_lanes, 16), 1) LOOP
                    v_share := v_share | (1 << v_p);
                END LOOP;
                v_held := {{.ClaimLocks}}(v_share, -1);
                IF v_held = 0 AND v_share <> 65535 THEN
                    v_held := {{.ClaimLocks}}(65535 & ~v_share, -1);
                END IF;
            END IF;
        END IF;
        v_all := v_held;
    END IF;

    LOOP
        v_pick := NULL;
        IF v_step = 1 THEN
            -- 1. The keyless queue.
            v_pick := ARRAY(
                SELECT x.ctid FROM {{.Outbox}} AS x
                 WHERE x.key = '' AND {{.IsFree}}(x.available_at, x.lease_until)
                 ORDER BY x.seq
                 LIMIT p_limit
                   FOR UPDATE SKIP LOCKED);

        ELSIF v_step = 3 THEN
            IF v_queue THEN
                IF v_shared THEN
                    v_held := {{.ClaimLocks}}(v_share, v_first);
                ELSE
                    PERFORM pg_advisory_xact_lock({{.LockKey}});
                    v_held := 65535;
                END IF;
                v_all := v_held;
                v_queue := false;
            END IF;
            -- 3. The window (O4). Under a partition's lock only Complete can hold a keyed
            --    row, one it is deleting after delivery, so SKIP LOCKED never lets a row
            --    overtake one of its key still to be sent (O5).
            IF v_held <> 0 THEN
                v_pick := ARRAY(
                    WITH w AS MATERIALIZED (
                        -- (The count of partitions held: the 1s of v_held.)
                        SELECT o.ctid, o.seq, o.key, {{.IsFree}}(o.available_at, o.lease_until) AS free
                          FROM (SELECT o.ctid, o.seq, o.key, o.available_at, o.lease_until
                                  FROM {{.Outbox}} AS o ORDER BY o.seq
                                 LIMIT v_window * least(16 / greatest(length(replace(v_held::bit(16)::text, '0', '')), 1), 4)) AS o
                         WHERE o.key = '' OR v_held & (1 << (hashtext(o.key) & 15)) <> 0
                         ORDER BY o.seq
                         LIMIT v_window),
                    -- Each key of the window with a run: its head (first seq) and stop (the
                    -- seq of its first row that is not free, or none); its run is its rows
                    -- before stop. (Aggregates, not window functions over every row: this
                    -- runs under the lock.)
                    k AS (
                        SELECT w.key, min(w.seq) AS head,
                               coalesce(min(w.seq) FILTER (WHERE NOT w.free), 9223372036854775807) AS stop
                          FROM w WHERE w.key <> ''
                         GROUP BY w.key
                        HAVING min(w.seq) < coalesce(min(w.seq) FILTER (WHERE NOT w.free), 9223372036854775807))
                    -- The keys whose head is at most the median head (the older half) first.
                    SELECT w.ctid FROM w LEFT JOIN k ON k.key = w.key
                     WHERE CASE WHEN w.key = '' THEN w.free ELSE w.seq < k.stop END
                     ORDER BY w.key <> '' AND k.head > (SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY m.head) FROM k AS m), w.seq
                     LIMIT p_limit - v_n);
            END IF;

        ELSIF v_step = 4 THEN
            -- Past the window only if it is full: otherwise the whole outbox is in it.
            v_deep := EXISTS (SELECT 1 FROM {{.Outbox}} AS o ORDER BY o.seq OFFSET v_window - 1 LIMIT 1);
            -- The free work the window holds (v_free). A claim without a lock waits for one
            -- if there is any (the first find is enough); one that the whole outbox, in the
            -- window, left short adds the partitions of what it finds (step 5). A head is a
            -- free row with no earlier row of its key; an earlier row of a key in the window
            -- is in the window, so its probes start at the outbox's first row, not at the
            -- deleted rows before it that vacuum has not removed.
            IF v_held = 0 OR (NOT v_deep AND v_all <> 65535) THEN
                SELECT coalesce(bit_or(x.bit), 0) INTO v_free FROM (
                    SELECT CASE WHEN w.key = '' THEN 65536 ELSE 1 << (hashtext(w.key) & 15) END AS bit
                      FROM (SELECT o.seq, o.key, o.available_at, o.lease_until
                              FROM {{.Outbox}} AS o ORDER BY o.seq LIMIT v_window) AS w
                     WHERE {{.IsFree}}(w.available_at, w.lease_until) AND (w.key = '' OR NOT EXISTS (
                            SELECT 1 FROM {{.Outbox}} AS p
                             WHERE p.key = w.key AND p.key <> '' AND p.seq < w.seq
                               AND p.seq >= (SELECT f.seq FROM {{.Outbox}} AS f ORDER BY f.seq LIMIT 1)))
                     LIMIT CASE WHEN v_held = 0 THEN 1 ELSE v_window END) AS x;
                IF v_held = 0 AND v_free <> 0 THEN
                    v_queue := true;
                    v_step := 3;
                    CONTINUE;
                END IF;
            END IF;
            IF NOT v_deep THEN
                EXIT WHEN v_held = 0;
                v_step := 5;
                CONTINUE;
            END IF;

            -- 4. Beyond the window (O4). Without a lock (other claims hold them all) this
            --    only decides whether to wait for one. The first row of each key (by the
            --    (key, seq) index): from v_start upwards, then from the lowest key up to it.
            v_start := coalesce((SELECT o.key FROM {{.Outbox}} AS o WHERE o.key <> '' AND o.seq = ANY (ARRAY(
                                    SELECT x.seq FROM {{.Outbox}} AS x ORDER BY x.seq
                                    OFFSET floor(abs(p_start) * v_window)::bigint % v_window LIMIT 1))), '');
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
            -- A head is free, or this claim's own (its run, leased in step 3, goes on).
            heads AS (
                SELECT o.key, o.seq FROM scanned AS o
                 WHERE ({{.IsFree}}(o.available_at, o.lease_until) OR o.claim_token = p_token)
                   AND (v_held = 0 OR v_held & (1 << (hashtext(o.key) & 15)) <> 0)
                 ORDER BY o.seq LIMIT p_limit - v_n)
            SELECT ARRAY(SELECT h.key FROM heads AS h ORDER BY h.seq),
                   ARRAY(SELECT h.seq FROM heads AS h ORDER BY h.seq)
              INTO v_keys, v_heads;
            IF v_held = 0 THEN
                EXIT WHEN cardinality(v_keys) = 0 AND NOT EXISTS (
                    SELECT 1 FROM {{.Outbox}} AS o WHERE o.key = '' AND {{.IsFree}}(o.available_at, o.lease_until));
                v_queue := true;
                v_step := 3;
                CONTINUE;
            END IF;
            -- Each key's run from its head, after this claim's own rows of step 3 (they are
            -- its first rows), while its rows are free; merged with the free keyless rows in
            -- waves (the n-th row of every run in wave n), the older half of the keys first.
            v_half := greatest((cardinality(v_keys) + 1) / 2, 1);
            v_pick := ARRAY(
                SELECT c.ctid FROM (
                    (SELECT o.ctid, o.seq, false AS later, 1::bigint AS wave
                       FROM {{.Outbox}} AS o
                      WHERE o.key = '' AND {{.IsFree}}(o.available_at, o.lease_until)
                      ORDER BY o.seq
                      LIMIT p_limit - v_n)
                    UNION ALL
                    SELECT r.ctid, r.seq, k.rank > v_half, r.wave
                      FROM unnest(v_keys, v_heads) WITH ORDINALITY AS k(key, head, rank)
                     CROSS JOIN LATERAL (
                        SELECT x.ctid, x.seq, x.wave FROM (
                            SELECT o.ctid, o.seq, row_number() OVER (ORDER BY o.seq) AS wave,
                                   bool_and({{.IsFree}}(o.available_at, o.lease_until)) OVER (ORDER BY o.seq) AS run
                              FROM (SELECT o.ctid, o.seq, o.available_at, o.lease_until
                                      FROM {{.Outbox}} AS o
                                     WHERE o.key = k.key AND o.key <> '' AND o.seq >= k.head
                                       AND o.claim_token IS DISTINCT FROM p_token
                                     ORDER BY o.seq
                                     LIMIT (p_limit - v_n + v_half - 1) / v_half) AS o) AS x
                         WHERE x.run) AS r) AS c
                 ORDER BY c.later, c.wave, c.seq
                 LIMIT p_limit - v_n);

        ELSE
            -- 5. More partitions: those that no claim holds now. Past a full window any of
            --    them may have work; otherwise only those of which the window (the whole
            --    outbox) holds a free head, as a relay at low load finds.
            v_want := 65535 & ~v_all;
            IF NOT v_deep THEN
                v_want := v_want & v_free;
            END IF;
            EXIT WHEN v_want = 0;
            v_more := {{.ClaimLocks}}(v_want, -1);
            EXIT WHEN v_more = 0;
            v_held := v_more;
            v_all := v_all | v_more;
            v_step := 3;
            CONTINUE;
        END IF;

        -- The lease (O5): the rows picked that are still free on their latest versions, but
        -- those another transaction holds. By ctid, from an array (a join would hash the
        -- whole table); the locking subquery returns the places of the rows it locked (their
        -- latest versions), which stay put while locked. Step 1's pick locked its rows
        -- itself, checked on their latest versions, so they are leased as they are (a second
        -- pass over them measured ~5 % of a keyless claim).
        IF v_pick IS NOT NULL THEN
            RETURN QUERY
            UPDATE {{.Outbox}} AS o
               SET claim_token = p_token,
                   lease_owner = p_owner,
                   lease_until = now() + p_lease_ms * interval '1 millisecond',
                   attempts    = o.attempts + 1
             WHERE o.ctid = ANY (CASE WHEN v_step = 1 THEN v_pick ELSE ARRAY(
                    SELECT x.ctid FROM {{.Outbox}} AS x
                     WHERE x.ctid = ANY (v_pick) AND {{.IsFree}}(x.available_at, x.lease_until)
                       FOR UPDATE SKIP LOCKED) END)
            RETURNING o.seq, o.id::text, o.type, o.key, coalesce(o.headers::text, ''), o.content_type,
                      o.body, o.created_at, o.attempts, o.first_failed_at, v_step;
            GET DIAGNOSTICS v_more = ROW_COUNT;
            v_n := v_n + v_more;
            EXIT WHEN v_step = 1 OR v_n >= p_limit;
        END IF;
        v_step := CASE v_step WHEN 3 THEN 4 ELSE 5 END;
    END LOOP;
END
$fn$;
