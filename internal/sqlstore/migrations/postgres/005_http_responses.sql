-- The responses of HTTP requests made idempotent by an Idempotency-Key (idempotency.HTTPHandler):
-- stored in the request's transaction, next to its key in the inbox, and replayed to retries.
-- Pruned with the inbox.
CREATE TABLE {{.Responses}} (
    consumer     text        NOT NULL,
    event_id     uuid        NOT NULL,
    request_hash text        NOT NULL,
    status       integer     NOT NULL,
    headers      text        NOT NULL,
    body         bytea       NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX {{idx "responses_processed_idx"}} ON {{.Responses}} (processed_at);
