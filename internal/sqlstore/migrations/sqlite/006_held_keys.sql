-- A dead-lettered keyed event holds its key (the relay's KeyPolicy HoldKey, the default): its
-- outbox row stays where it is, never claimable (available_at '9999-12-31 23:59:59.999'),
-- and the later events of its key wait behind it, as behind a row waiting for a retry.
-- held_seq is the outbox row a pending dead letter holds: replaying the entry makes that row
-- deliverable again where it stands, discarding it deletes the row. The index serves the
-- held keys' count (Stats.HeldKeys) and list (outbox status). Statements end with ';' at
-- the end of a line (see splitStatements).

ALTER TABLE {{.DeadLetters}} ADD COLUMN held_seq INTEGER;

CREATE INDEX IF NOT EXISTS {{if .Schema}}{{quote .Schema}}.{{end}}{{idx "dead_letters_held_idx"}} ON {{quote (printf "%s_dead_letters" .Prefix)}} (id) WHERE status = 'pending' AND held_seq IS NOT NULL;
