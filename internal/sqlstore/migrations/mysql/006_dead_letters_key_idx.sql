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
