-- A dead-lettered keyed event holds its key (the relay's KeyPolicy HoldKey, the default): its
-- outbox row stays where it is, never claimable (available_at 'infinity'), and the later
-- events of its key wait behind it, as behind a row waiting for a retry. held_seq is the
-- outbox row a pending dead letter holds: replaying the entry makes that row deliverable
-- again where it stands, discarding it deletes the row. The index serves the held keys'
-- count (Stats.HeldKeys) and list (outbox status): the pending entries that hold a row.

ALTER TABLE {{.DeadLetters}} ADD COLUMN held_seq bigint;

CREATE INDEX {{idx "dead_letters_held_idx"}} ON {{.DeadLetters}} (id) WHERE status = 'pending' AND held_seq IS NOT NULL;
