-- Dead letters are stored whatever their content: a malformed message without a readable
-- event ID gets NULL (never a made-up all-zero UUID); kind classifies the failure for
-- filtering; broker_message_id finds a malformed message in the broker's logs; raw keeps
-- the entry as it came (deadletter.Raw's text) when it had to be changed to be stored.

ALTER TABLE {{.DeadLetters}}
    ALTER COLUMN event_id DROP NOT NULL,
    ADD COLUMN kind              text  NOT NULL DEFAULT '',
    ADD COLUMN broker_message_id text  NOT NULL DEFAULT '',
    ADD COLUMN raw               bytea;

-- Earlier malformed messages were stored with the all-zero UUID; earlier entries are
-- classified by the reasons the relay and the consumer wrote.
UPDATE {{.DeadLetters}} SET event_id = NULL WHERE event_id = '00000000-0000-0000-0000-000000000000';
UPDATE {{.DeadLetters}} SET kind = CASE
        WHEN reason LIKE 'undecodable message:%' THEN 'malformed'
        WHEN reason LIKE 'no handler for event type %' THEN 'unknown-type'
        WHEN reason LIKE 'gave up after %' OR reason LIKE 'claimed % times without an outcome%' THEN 'gave-up'
        ELSE '' END;

-- A raw-SQL producer could write created_at = 'infinity', which some drivers (lib/pq, bun's
-- pgdriver) cannot read, failing every claim that returns the row: refuse it at the insert,
-- as Publish refuses what no transport carries. NOT VALID skips checking existing rows.
ALTER TABLE {{.Outbox}} ADD CONSTRAINT {{idx "created_at_finite"}} CHECK (isfinite(created_at)) NOT VALID;

CREATE INDEX {{idx "dead_letters_broker_msg_idx"}} ON {{.DeadLetters}} (broker_message_id) WHERE broker_message_id <> '';
