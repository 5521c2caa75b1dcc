-- Scheduled events (outbox.WithDeliverAt): Publish writes an event due later here instead of
-- into the outbox, so the claim never reads it; the relay's store moves due rows into the
-- outbox (in due order, as if they were published then) and Cancel deletes a row still here.
-- Idempotent, as every MySQL migration (DDL commits implicitly).

CREATE TABLE IF NOT EXISTS {{.Scheduled}} (
    seq          BIGINT       NOT NULL AUTO_INCREMENT,
    id           CHAR(36)     NOT NULL,
    type         VARCHAR(255) NOT NULL,
    `key`        VARCHAR(255) NOT NULL DEFAULT '',
    headers      JSON         NULL,
    content_type VARCHAR(255) NOT NULL,
    body         LONGBLOB     NOT NULL,
    created_at   DATETIME(6)  NOT NULL,
    deliver_at   DATETIME(6)  NOT NULL,
    PRIMARY KEY (seq),
    -- The move takes the due rows in due order; Stats reads the next due time from the front.
    INDEX {{idx "scheduled_due_idx"}} (deliver_at, seq),
    -- Cancel finds a scheduled event by its ID.
    INDEX {{idx "scheduled_id_idx"}} (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
