-- The responses of HTTP requests made idempotent by an Idempotency-Key (idempotency.HTTPHandler):
-- stored in the request's transaction, next to its key in the inbox, and replayed to retries.
-- Pruned with the inbox.
CREATE TABLE IF NOT EXISTS {{.Responses}} (
    consumer     TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    request_hash TEXT    NOT NULL,
    status       INTEGER NOT NULL,
    headers      TEXT    NOT NULL,
    body         BLOB    NOT NULL,
    processed_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    PRIMARY KEY (consumer, event_id)
);

CREATE INDEX IF NOT EXISTS {{if .Schema}}{{quote .Schema}}.{{end}}{{idx "responses_processed_idx"}} ON {{quote (printf "%s_http_responses" .Prefix)}} (processed_at);
