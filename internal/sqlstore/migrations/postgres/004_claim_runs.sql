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
-- Held rows. A keyed row that the relay dead-lettered under KeyPolicy HoldKey stays in the
-- outbox, the first row of its key, with available_at 'infinity' and no lease (DeadLetter,
-- postgres.go): to every step below it is a row waiting for a retry that never comes due,
-- so no step takes it, and none takes a later row of its key:
--   step 1 takes keyless rows only (a held row is keyed, so its probe sends the claim on);
--   step 3's window is a prefix of the outbox in seq order (of the partitions held), so it
--     holds the held row whenever it holds a later row of its key; the key's head is then
--     not free, the key has no run (head < stop fails) and its rows no stop (NULL: none
--     is taken); the look without a lock counts a row as free work only when no earlier row
--     of its key exists;
--   step 4's loose index scan reads each key's first row by (key, seq): the held row, which
--     is neither free nor this claim's, so the key gives no head, and runs start at heads;
--   step 5 runs steps 3 and 4 again for more partitions;
--   every lease statement re-checks available_at <= now() on the row's latest version.
-- A held row has no claim token, so no write-back, stale or not, touches it. It becomes
-- held in the DeadLetter write-back under the claims' locks (shared, like Retry), so no
-- claim plans a run while it changes from leased to held. It stops being held only through
-- the dead-letter table: Replay makes it due where it stands (its key's head, so it goes
-- first), Discard deletes it. Both only remove a wait, as a retry coming due or Complete
-- does: a claim that read the row held leaves its key alone, one that reads it due takes it
-- first, so neither needs the locks.
--
-- 1. An outbox with no keyed row at all (one probe of the keyed index) is a plain queue:
--    the oldest free rows, FOR UPDATE SKIP LOCKED, without the locks below. Keyless rows
--    have no order to keep, and this claim leases keyless rows only, so concurrent claims
--    of a keyless outbox run in parallel, each skipping the rows the others hold.
-- 2. Claims of keyed rows are serialised per key: a key belongs to one of 16 partitions
--    (hashtext(key) & 15), and a claim leases rows of a key only while it holds that
--    partition's transaction-scoped advisory lock, or the claims' lock of all keys
--    exclusively, so it sees every lease of the key committed before it. At low load (the
--    last claim of the connection was not full) or for a relay of one loop, a claim takes
--    the lock of all keys alone: one lock, as cheap as a single lock. In a backlog, each of
--    a relay's loops (p_lane of p_lanes) takes it in shared mode and then the partitions of
--    its own share (p % p_lanes = p_lane), or, if other claims hold all of those, any that
--    no claim holds: the loops' claims run side by side instead of queueing behind one
--    lock (one lock made keyed drains of many keys ~0.5 of keyless ones). Write-backs that
--    keep or move rows (Retry, Release, DeadLetter) take all 17 in shared mode, so no claim
--    reads a run while a relay whose lease expired is rescheduling a row of it. Locks are
--    only tried, never waited for, except by a claim that got none: it looks without them
--    (the window) and queues only if it sees a free keyless row or a free head there, or,
--    past a full window, in step 4; once it holds a lock, it starts again from step 3
--    (what it saw is stale: the claims before it leased rows). Which partitions a claim
--    holds changes which keys it may take, never the order within a key.
-- 3. The window: the first 2 × p_limit rows in seq order (one index range) that are
--    keyless or of a partition held, or 4 × on a connection whose last claims found less
--    than 3/4 of a claim in a full window (few keys: the runs of the keys a concurrent claim
--    holds fill its front; set back to 2 × after 32 claims that the wide window filled).
--    Holding k of the 16 partitions, it reads at most min(16 / k, 4) times as many rows of
--    the outbox: a share of the keys fills it as the whole did, and a share with few rows
--    costs a bounded read, never the backlog. Its free keyless rows and the runs of its
--    keys, oldest first, the runs of the older half of those keys
--    before the others, leaving those to a concurrent claim. Leased FOR UPDATE SKIP LOCKED:
--    under its partition's lock a keyed row can be held only by Complete, and a row it
--    holds was delivered, so a later row of its key may go (a keyless row may be held by
--    any other claim). Rows are updated by their place in the heap (ctid), read and
--    locked in the same statement.
-- 4. A full window that did not fill the claim (every key there is in flight, few keys,
--    or keyless rows in front): keyless rows beyond it come from their own index, and the
--    heads of keys from a loose index scan over (key, seq), one descent per key, from a
--    random key near the front, wrapping around, at most 4 × (p_limit - claimed) keys.
--    Each free head of a partition held gives its run, read again under the lock; as in
--    step 3 the runs of the older half of the keys go first, (p_limit - claimed) /
--    (keys / 2) deep, so a claim that took a few rows of every key does not leave a
--    concurrent claim none. A run that the window cut short goes on beyond it.
-- 5. Still not full (the share's keys are few or in flight): the partitions that no claim
--    holds now are added, and steps 3 and 4 run again for their keys.
--
-- The relay's own commits may be lost on a crash without losing events (only re-sending
-- them), so they skip the WAL flush.

-- Takes the claims' advisory locks of the key partitions in p_want (bit p: partition p),
-- without waiting for any, and returns the set it holds; with p_first a partition (not -1),
-- it waits for that one's lock first. The lock of partition p is the outbox's lock key XOR
-- (p + 1); the key itself is the lock of all keys (step 2 of the claim).
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
-- DeadLetter) hold them, so that no claim runs beside one (step 2 of the claim).
CREATE FUNCTION {{.WriteBacks}}()
RETURNS void
LANGUAGE plpgsql
AS $fn$
BEGIN
    PERFORM count(pg_advisory_xact_lock_shared(({{.LockKey}})::bigint # p)) FROM generate_series(0, 16) AS p;
END
$fn$;

DROP FUNCTION {{.ClaimFunc}}(text, bigint, integer, bigint);
CREATE FUNCTION {{.ClaimFunc}}(p_owner text, p_token bigint, p_limit integer, p_lease_ms bigint,
                               p_lane integer, p_lanes integer)
RETURNS TABLE (seq bigint, id text, type text, key text, headers text, content_type text,
               body bytea, created_at timestamptz, attempts integer, first_failed_at timestamptz)
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
    -- Settings of this connection, named after the outbox. The window's width (step 3)
    -- adapts to the outbox: see there.
    v_outbox  text := translate(({{.LockKey}})::text, '-', 'n');
    v_guc     text := 'txoutbox.claim_window_' || v_outbox;
    v_wide    integer := coalesce(nullif(current_setting(v_guc, true), '')::integer, 0);
    v_window  integer := CASE WHEN v_wide > 0 THEN 4 ELSE 2 END * p_limit;
    -- Whether the last claim of this connection was full (a backlog; see step 2), and how
    -- many more such claims may skip step 1's probe: 32 down to 1, or none.
    v_gucb    text := 'txoutbox.claim_backlog_' || v_outbox;
    v_left    integer := coalesce(nullif(current_setting(v_gucb, true), '')::integer, 0);
    v_backlog boolean := v_left > 0;
    -- The partitions of keys (bit p: hashtext(key) & 15 = p) of this loop's share, and those
    -- whose lock this claim holds.
    v_share   integer := 0;
    v_first   integer := 0;
    v_held    integer := 0;  -- none: no lock yet
    v_shared  boolean := false;
    v_queue   boolean := false;
    v_all     integer;
    v_want    integer;
    v_deep    boolean;
    v_free    integer := 0;
    v_more    integer;
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
    --    order, so the claim is the plain SKIP LOCKED queue read, without the locks. (Steps
    --    1, 3 and 4 each have their own lease statement: one statement with a branch per
    --    case measured ~150 µs more per claim, the executor setting up every branch's plan
    --    each time.) The rows are updated by their place in the heap (ctid), read and
    --    locked in this statement: no second descent of the primary key per row. The probe
    --    is skipped while this connection's claims come back full of a keyed backlog (31 in
    --    a row at most, then it probes again): it walks the index entries of delivered keys
    --    that vacuum has not removed yet, thousands after a drain of many keys (~0.3 ms a
    --    probe; skipping it drains distinct keys ~25 % faster). The keyed claim takes
    --    keyless rows as well, only at a higher cost.
    v_keyed := v_left > 1 OR EXISTS (SELECT 1 FROM {{.Outbox}} AS o WHERE o.key <> '');
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
                  o.body, o.created_at, o.attempts, o.first_failed_at;
        RETURN;
    END IF;

    -- 2. The locks. The claims' lock (of all keys): a claim of one relay loop (p_lanes
    --    1), or one made after a claim that was not full (at low load one loop polls, the
    --    others wait for a backlog), takes it alone, exclusively, if no claim holds it:
    --    one lock, one pass over the window for every key. Otherwise (a backlog, where
    --    every loop claims, or the lock is taken) the claim takes it in shared mode, then
    --    its loop's share of the partitions (p % p_lanes = p_lane), or, if other claims
    --    hold all of that, any partitions no claim holds. If it got none, it queues (for
    --    its share's first partition, or for the claims' lock if it could not share it)
    --    only if the window holds a free keyless row or a free head (a row with no earlier
    --    row of its key), or, past a full window, step 4 finds one.
    IF p_lanes <= 1 OR NOT v_backlog THEN
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

    -- 3. The window: the first 2 × p_limit rows. Its free keyless rows and the runs of its
    --    keys (each key's rows from its first one, while they are free), oldest first, the
    --    older half of the keys before the other. Under the lock, only Complete can hold a
    --    keyed row (one it is deleting after delivery), so SKIP LOCKED never lets a row
    --    overtake one of its key that is still to be sent. (A claim of step 1 that saw no
    --    keyed row may hold keyless ones, and so may a claim holding other partitions.)
    --    v_held: the partitions of this pass (step 5 adds others); v_all: all held.
    LOOP
        IF v_queue THEN
            -- What the look saw is stale once a lock is ours (the claim that held it leased
            -- rows meanwhile): start again from the window, under the lock.
            IF v_shared THEN
                v_held := {{.ClaimLocks}}(v_share, v_first);
            ELSE
                PERFORM pg_advisory_xact_lock({{.LockKey}});
                v_held := 65535;
            END IF;
            v_all := v_held;
            v_queue := false;
        END IF;
        IF v_held <> 0 THEN
            RETURN QUERY
            WITH w AS MATERIALIZED (
                -- (The count of partitions held: the 1s of v_held.)
                SELECT o.ctid, o.seq, o.key, o.available_at <= now() AND (o.lease_until IS NULL OR o.lease_until <= now()) AS free
                  FROM (SELECT o.ctid, o.seq, o.key, o.available_at, o.lease_until
                          FROM {{.Outbox}} AS o ORDER BY o.seq
                         LIMIT v_window * least(16 / greatest(length(replace(v_held::bit(16)::text, '0', '')), 1), 4)) AS o
                 WHERE o.key = '' OR v_held & (1 << (hashtext(o.key) & 15)) <> 0
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
                  FROM w WHERE w.key <> '' AND v_held & (1 << (hashtext(w.key) & 15)) <> 0
                 GROUP BY w.key
                HAVING min(w.seq) < coalesce(min(w.seq) FILTER (WHERE NOT w.free), 9223372036854775807)),
            c AS (
                SELECT w.ctid FROM w LEFT JOIN k ON k.key = w.key
                 WHERE CASE WHEN w.key = '' THEN w.free ELSE w.seq < k.stop END
                 ORDER BY w.key <> '' AND k.head > (SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY m.head) FROM k AS m), w.seq
                 LIMIT p_limit - v_n)
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
                      o.body, o.created_at, o.attempts, o.first_failed_at;
            GET DIAGNOSTICS v_more = ROW_COUNT;
            v_n := v_n + v_more;
            IF v_n >= p_limit THEN
                IF v_wide > 0 THEN
                    PERFORM set_config(v_guc, (v_wide - 1)::text, false);
                END IF;
                EXIT;
            END IF;
            v_short := v_n < p_limit * 3 / 4;
        END IF;
        -- Past the window only if it is full: otherwise the whole outbox is in it.
        v_deep := EXISTS (SELECT 1 FROM {{.Outbox}} AS o ORDER BY o.seq OFFSET v_window - 1 LIMIT 1);
        -- What the window holds free to take: bit p for a head (a row with no earlier row of
        -- its key) of partition p, bit 16 for a keyless row. A claim without a lock queues
        -- for one if there is any; one that the whole outbox, in the window, left short
        -- looks for partitions to add (step 5). (An earlier row of a key in the window is in
        -- the window: the probe starts at the outbox's first row, not at the deleted rows
        -- before it that vacuum has not removed.)
        IF v_held = 0 OR (NOT v_deep AND v_all <> 65535) THEN
            -- (Without a lock the first find is enough.)
            SELECT coalesce(bit_or(x.bit), 0) INTO v_free FROM (
                SELECT CASE WHEN w.key = '' THEN 65536 ELSE 1 << (hashtext(w.key) & 15) END AS bit
                  FROM (SELECT o.seq, o.key, o.available_at <= now() AND (o.lease_until IS NULL OR o.lease_until <= now()) AS free
                          FROM {{.Outbox}} AS o ORDER BY o.seq LIMIT v_window) AS w
                 WHERE w.free AND (w.key = '' OR NOT EXISTS (
                        SELECT 1 FROM {{.Outbox}} AS p
                         WHERE p.key = w.key AND p.key <> '' AND p.seq < w.seq
                           AND p.seq >= (SELECT f.seq FROM {{.Outbox}} AS f ORDER BY f.seq LIMIT 1)))
                 LIMIT CASE WHEN v_held = 0 THEN 1 ELSE v_window END) AS x;
            IF v_held = 0 AND v_free <> 0 THEN
                v_queue := true;
                CONTINUE;
            END IF;
        END IF;
        IF v_deep THEN
            IF v_short THEN
                PERFORM set_config(v_guc, '32', false);
            END IF;

            -- 4. A deep backlog that the window did not fill the claim from: its keys' heads
            --    are in flight, or there are few keys, or keyless rows fill the window. The
            --    heads of keys come from a loose index scan over (key, seq): one descent per
            --    key, from a random key near the front, wrapping around, at most
            --    4 × (p_limit - claimed) keys; keyless rows beyond the window from their own
            --    index. Without a lock (other claims hold them all) this only decides whether
            --    to queue for one.
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
                 WHERE ((o.available_at <= now() AND (o.lease_until IS NULL OR o.lease_until <= now())) OR o.claim_token = p_token)
                   AND (v_held = 0 OR v_held & (1 << (hashtext(o.key) & 15)) <> 0)
                 ORDER BY o.seq LIMIT p_limit - v_n)
            SELECT ARRAY(SELECT h.key FROM heads AS h ORDER BY h.seq),
                   ARRAY(SELECT h.seq FROM heads AS h ORDER BY h.seq)
              INTO v_keys, v_heads;
            IF v_held = 0 THEN
                IF cardinality(v_keys) = 0 AND NOT EXISTS (SELECT 1 FROM {{.Outbox}} AS o WHERE o.key = '' AND o.available_at <= now() AND (o.lease_until IS NULL OR o.lease_until <= now())) THEN
                    RETURN;
                END IF;
                v_queue := true;
                CONTINUE;
            END IF;

            -- Each key whose head is free gives its run from the head (read again, under the
            -- lock); as in step 3, the runs of the older half of the keys go first, leaving
            -- the others to a concurrent claim (a claim that took a few rows of every key
            -- would leave it none), so runs are read (p_limit - claimed) / (keys / 2) deep.
            -- Within each half, runs are merged with keyless rows in waves. This claim's own
            -- leases from step 3 are visible here, and a run goes on after them (they are the
            -- first rows of its key): a key whose run the window cut short continues beyond.
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
                      o.body, o.created_at, o.attempts, o.first_failed_at;
            GET DIAGNOSTICS v_more = ROW_COUNT;
            v_n := v_n + v_more;
            EXIT WHEN v_n >= p_limit;
        ELSIF v_held = 0 THEN
            RETURN;
        END IF;
        -- 5. Not full: the keys of the partitions that no claim holds now, if any. Past a
        --    full window, any of them may have some; otherwise only those of which the
        --    window (the whole outbox) holds a free head, as a relay at low load finds.
        v_want := 65535 & ~v_all;
        IF NOT v_deep THEN
            v_want := v_want & v_free;
        END IF;
        EXIT WHEN v_want = 0;
        v_more := {{.ClaimLocks}}(v_want, -1);
        EXIT WHEN v_more = 0;
        v_held := v_more;
        v_all := v_all | v_more;
    END LOOP;
    IF v_n >= p_limit THEN
        PERFORM set_config(v_gucb, (CASE WHEN v_left > 1 THEN v_left - 1 ELSE 32 END)::text, false);
    ELSIF v_backlog THEN
        PERFORM set_config(v_gucb, '', false);
    END IF;
END
$fn$;
