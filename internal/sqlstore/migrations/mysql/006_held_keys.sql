-- Held keys: the relay's (held_seq) and the consumer's (two partial indexes for its lookup).

-- A dead-lettered keyed event holds its key (the relay's KeyPolicy HoldKey, the default): its
-- outbox row stays where it is, never claimable (available_at '9999-12-31 23:59:59.999999',
-- the largest DATETIME), and the later events of its key wait behind it, as behind a row
-- waiting for a retry. held_seq is the outbox row a pending dead letter holds: replaying
-- the entry makes that row deliverable again where it stands, discarding it deletes the
-- row. The index serves the held keys' count (Stats.HeldKeys) and list (outbox status).
-- MySQL 8 has no ADD COLUMN IF NOT EXISTS, so the one ALTER (atomic on InnoDB) runs only
-- while the column is missing: a migration cut short repeats safely.

SET @txoutbox_006 = IF(
    (SELECT COUNT(*) FROM information_schema.COLUMNS
      WHERE TABLE_SCHEMA = {{if .Schema}}'{{.Schema}}'{{else}}DATABASE(){{end}}
        AND TABLE_NAME = '{{.Prefix}}_dead_letters' AND COLUMN_NAME = 'held_seq') = 0,
    'ALTER TABLE {{.DeadLetters}}
        ADD COLUMN held_seq BIGINT NULL,
        ADD INDEX {{idx "dl_held_idx"}} (status, held_seq)',
    'DO 0');
PREPARE txoutbox_006 FROM @txoutbox_006;
EXECUTE txoutbox_006;
DEALLOCATE PREPARE txoutbox_006;

-- A consumer that holds keys (consumer.Config.HoldKeys) asks, for each keyed delivery,
-- whether the key has a pending dead letter of this consumer (the first index, by ID) or
-- was replayed since the event was published (the second, by replay time). MySQL 8 has no
-- CREATE INDEX IF NOT EXISTS, so the one ALTER runs only while the first index is
-- missing: a migration cut short repeats safely.

SET @txoutbox_006 = IF(
    (SELECT COUNT(*) FROM information_schema.STATISTICS
      WHERE TABLE_SCHEMA = {{if .Schema}}'{{.Schema}}'{{else}}DATABASE(){{end}}
        AND TABLE_NAME = '{{.Prefix}}_dead_letters' AND INDEX_NAME = '{{.Prefix}}_dl_consumer_key_idx') = 0,
    'ALTER TABLE {{.DeadLetters}}
        ADD INDEX {{idx "dl_consumer_key_idx"}} (consumer, event_key, status, id),
        ADD INDEX {{idx "dl_consumer_replayed_idx"}} (consumer, event_key, status, status_changed_at)',
    'DO 0');
PREPARE txoutbox_006 FROM @txoutbox_006;
EXECUTE txoutbox_006;
DEALLOCATE PREPARE txoutbox_006;
