-- The inbox: one row per (consumer, event) whose effects committed. Idempotent handlers
-- insert here in their own transaction; pruning removes rows older than the retention window.
CREATE TABLE IF NOT EXISTS {{.Inbox}} (
    consumer     TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    processed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    PRIMARY KEY (consumer, event_id)
);

CREATE INDEX IF NOT EXISTS {{if .Schema}}{{quote .Schema}}.{{end}}{{idx "inbox_processed_idx"}} ON {{quote (printf "%s_inbox" .Prefix)}} (processed_at);
