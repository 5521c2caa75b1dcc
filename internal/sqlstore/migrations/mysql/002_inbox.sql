-- The inbox: one row per (consumer, event) whose effects committed. Idempotent handlers
-- insert here in their own transaction; pruning removes rows older than the retention window.
CREATE TABLE IF NOT EXISTS {{.Inbox}} (
    consumer     VARCHAR(255) NOT NULL,
    event_id     CHAR(36)     NOT NULL,
    processed_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (consumer, event_id),
    INDEX {{idx "inbox_processed_idx"}} (processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
