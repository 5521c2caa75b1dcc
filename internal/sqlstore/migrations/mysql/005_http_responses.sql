-- The responses of HTTP requests made idempotent by an Idempotency-Key (idempotency.HTTPHandler):
-- stored in the request's transaction, next to its key in the inbox, and replayed to retries.
-- Pruned with the inbox.
CREATE TABLE IF NOT EXISTS {{.Responses}} (
    consumer     VARCHAR(255) NOT NULL,
    event_id     CHAR(36)     NOT NULL,
    request_hash CHAR(64)     NOT NULL,
    status       INT          NOT NULL,
    headers      TEXT         NOT NULL,
    body         LONGBLOB     NOT NULL,
    processed_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (consumer, event_id),
    INDEX {{idx "responses_processed_idx"}} (processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
