-- The outbox, the dead-letter table, and the relay's complete function (its claim: 004).


CREATE TABLE {{.Outbox}} (
    seq             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id              uuid        NOT NULL,
    type            text        NOT NULL,
    key             text        NOT NULL DEFAULT '',
    headers         jsonb,
    content_type    text        NOT NULL,
    body            bytea       NOT NULL,
    created_at      timestamptz NOT NULL,
    available_at    timestamptz NOT NULL DEFAULT now(),
    attempts        integer     NOT NULL DEFAULT 0,
    claim_token     bigint,
    lease_owner     text,
    lease_until     timestamptz,
    first_failed_at timestamptz,
    last_error      text
) WITH (
    -- Leasing a row updates only unindexed columns: room on the page keeps those updates HOT
    -- (a claim leases whole pages of rows at once, so half the page is kept free).
    fillfactor = 50,
    -- A queue table churns: vacuum it after ~1% dead rows, not the default 20%.
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02
);

-- Serves the claim's "no earlier message of this key is leased or waiting" check.
CREATE INDEX {{idx "key_seq_idx"}} ON {{.Outbox}} (key, seq) WHERE key <> '';

CREATE TABLE {{.DeadLetters}} (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id          uuid        NOT NULL,
    event_type        text        NOT NULL,
    event_key         text        NOT NULL DEFAULT '',
    headers           jsonb,
    content_type      text        NOT NULL DEFAULT '',
    body              bytea       NOT NULL,
    created_at        timestamptz NOT NULL,
    stage             text        NOT NULL CHECK (stage IN ('relay', 'consumer')),
    consumer          text        NOT NULL DEFAULT '',
    reason            text        NOT NULL,
    attempts          integer     NOT NULL,
    first_failed_at   timestamptz NOT NULL,
    last_failed_at    timestamptz NOT NULL,
    status            text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'replayed', 'discarded')),
    status_changed_at timestamptz
);
-- "What failed since yesterday, and why": by status and time; and by event.
CREATE INDEX {{idx "dead_letters_status_time_idx"}} ON {{.DeadLetters}} (status, last_failed_at);
CREATE INDEX {{idx "dead_letters_time_idx"}} ON {{.DeadLetters}} (last_failed_at);
CREATE INDEX {{idx "dead_letters_event_idx"}} ON {{.DeadLetters}} (event_id);

-- Complete deletes delivered messages of one claim, skipping the WAL flush like the claim.
-- When they are every seq from the lowest to the highest (a claim of keyless rows mostly is),
-- it deletes that range of the primary key (one descent) instead of looking each up: the
-- claim's rows in the range are exactly these. The plans are generic and never scan the
-- whole table, as in the claim (004).
CREATE FUNCTION {{.CompleteFunc}}(p_token bigint, p_seqs bigint[])
RETURNS void
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $fn$
DECLARE
    v_lo bigint;
    v_hi bigint;
    v_n  bigint;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT min(s), max(s), count(DISTINCT s) INTO v_lo, v_hi, v_n FROM unnest(p_seqs) AS s;
    IF v_hi - v_lo + 1 = v_n THEN
        DELETE FROM {{.Outbox}} WHERE claim_token = p_token AND seq BETWEEN v_lo AND v_hi;
    ELSE
        DELETE FROM {{.Outbox}} WHERE claim_token = p_token AND seq = ANY (p_seqs);
    END IF;
END
$fn$;
