-- The inbox: one row per (consumer, event) whose effects committed. Idempotent handlers
-- insert here in their own transaction; pruning removes rows older than the retention window.
CREATE TABLE {{.Inbox}} (
    consumer     text        NOT NULL,
    event_id     uuid        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX {{idx "inbox_processed_idx"}} ON {{.Inbox}} (processed_at);
