-- Dead letters are stored whatever their content: a malformed message without a readable
-- event ID gets NULL (never a made-up all-zero UUID); kind classifies the failure for
-- filtering; broker_message_id finds a malformed message in the broker's logs; raw keeps
-- the entry as it came (deadletter.Raw's text) when it had to be changed to be stored.
-- MySQL 8 has no ADD COLUMN IF NOT EXISTS, so the one ALTER (atomic on InnoDB) runs only
-- while the raw column is missing: a migration cut short repeats safely.

SET @txoutbox_003 = IF(
    (SELECT COUNT(*) FROM information_schema.COLUMNS
      WHERE TABLE_SCHEMA = {{if .Schema}}'{{.Schema}}'{{else}}DATABASE(){{end}}
        AND TABLE_NAME = '{{.Prefix}}_dead_letters' AND COLUMN_NAME = 'raw') = 0,
    'ALTER TABLE {{.DeadLetters}}
        MODIFY COLUMN event_id CHAR(36) NULL,
        ADD COLUMN kind VARCHAR(255) NOT NULL DEFAULT '''',
        ADD COLUMN broker_message_id VARCHAR(255) NOT NULL DEFAULT '''',
        ADD COLUMN raw LONGBLOB NULL,
        ADD INDEX {{idx "dl_broker_msg_idx"}} (broker_message_id)',
    'DO 0');
PREPARE txoutbox_003 FROM @txoutbox_003;
EXECUTE txoutbox_003;
DEALLOCATE PREPARE txoutbox_003;

-- Earlier malformed messages were stored with the all-zero UUID; earlier entries are
-- classified by the reasons the relay and the consumer wrote.
UPDATE {{.DeadLetters}} SET event_id = NULL WHERE event_id = '00000000-0000-0000-0000-000000000000';
UPDATE {{.DeadLetters}} SET kind = CASE
        WHEN reason LIKE 'undecodable message:%' THEN 'malformed'
        WHEN reason LIKE 'no handler for event type %' THEN 'unknown-type'
        WHEN reason LIKE 'gave up after %' OR reason LIKE 'claimed % times without an outcome%' THEN 'gave-up'
        ELSE '' END
 WHERE kind = '';
