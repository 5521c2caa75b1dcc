-- Held keys: the relay's (held_seq) and the consumer's (two partial indexes for its lookup).

-- A dead-lettered keyed event holds its key (the relay's KeyPolicy HoldKey, the default): its
-- outbox row stays where it is, never claimable (available_at '9999-12-31 23:59:59.999'),
-- and the later events of its key wait behind it, as behind a row waiting for a retry.
-- held_seq is the outbox row a pending dead letter holds: replaying the entry makes that row
-- deliverable again where it stands, discarding it deletes the row. The index serves the
-- held keys' count (Stats.HeldKeys) and list (outbox status). Statements end with ';' at
-- the end of a line (see splitStatements).

ALTER TABLE {{.DeadLetters}} ADD COLUMN held_seq INTEGER;

CREATE INDEX IF NOT EXISTS {{if .Schema}}{{quote .Schema}}.{{end}}{{idx "dead_letters_held_idx"}} ON {{quote (printf "%s_dead_letters" .Prefix)}} (id) WHERE status = 'pending' AND held_seq IS NOT NULL;

-- A consumer that holds keys (consumer.Config.HoldKeys) asks, for each keyed delivery,
-- whether the key has a pending dead letter of this consumer (the first index, by ID) or
-- was replayed since the event was published (the second, by replay time). Both hold
-- consumer-stage entries with a key only.
CREATE INDEX IF NOT EXISTS {{if .Schema}}{{quote .Schema}}.{{end}}{{idx "dead_letters_consumer_key_idx"}} ON {{quote (printf "%s_dead_letters" .Prefix)}} (consumer, event_key, status, id)
    WHERE stage = 'consumer' AND event_key <> '';
CREATE INDEX IF NOT EXISTS {{if .Schema}}{{quote .Schema}}.{{end}}{{idx "dead_letters_consumer_replayed_idx"}} ON {{quote (printf "%s_dead_letters" .Prefix)}} (consumer, event_key, status_changed_at)
    WHERE stage = 'consumer' AND event_key <> '' AND status = 'replayed';
