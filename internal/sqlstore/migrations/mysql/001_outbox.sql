-- The outbox, the dead-letter table and the claim lock (MySQL 8.0.13+ / MariaDB 10.6+).
-- MySQL commits DDL implicitly, so a migration cannot roll back: every statement here is
-- idempotent (IF NOT EXISTS, INSERT IGNORE) and a migration cut short by a crash simply
-- runs again. Statements end with ';' at the end of a line (see splitStatements).
-- Times are DATETIME(6) in UTC, written and compared with the server's UTC_TIMESTAMP(6).
-- utf8mb4_bin makes keys compare byte for byte, as PostgreSQL's text does.

CREATE TABLE IF NOT EXISTS {{.Outbox}} (
    seq             BIGINT       NOT NULL AUTO_INCREMENT,
    id              CHAR(36)     NOT NULL,
    type            VARCHAR(255) NOT NULL,
    `key`           VARCHAR(255) NOT NULL DEFAULT '',
    headers         JSON         NULL,
    content_type    VARCHAR(255) NOT NULL,
    body            LONGBLOB     NOT NULL,
    created_at      DATETIME(6)  NOT NULL,
    available_at    DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    attempts        INT          NOT NULL DEFAULT 0,
    claim_token     BIGINT       NULL,
    lease_owner     VARCHAR(255) NULL,
    lease_until     DATETIME(6)  NULL,
    first_failed_at DATETIME(6)  NULL,
    last_error      TEXT         NULL,
    PRIMARY KEY (seq),
    -- Serves the claim's "no earlier message of this key is leased or waiting" check.
    INDEX {{idx "key_seq_idx"}} (`key`, seq)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {{.DeadLetters}} (
    id                BIGINT       NOT NULL AUTO_INCREMENT,
    event_id          CHAR(36)     NOT NULL,
    event_type        VARCHAR(255) NOT NULL,
    event_key         VARCHAR(255) NOT NULL DEFAULT '',
    headers           JSON         NULL,
    content_type      VARCHAR(255) NOT NULL DEFAULT '',
    body              LONGBLOB     NOT NULL,
    created_at        DATETIME(6)  NOT NULL,
    stage             VARCHAR(16)  NOT NULL,
    consumer          VARCHAR(255) NOT NULL DEFAULT '',
    reason            TEXT         NOT NULL,
    attempts          INT          NOT NULL,
    first_failed_at   DATETIME(6)  NOT NULL,
    last_failed_at    DATETIME(6)  NOT NULL,
    status            VARCHAR(16)  NOT NULL DEFAULT 'pending',
    status_changed_at DATETIME(6)  NULL,
    PRIMARY KEY (id),
    -- "What failed since yesterday, and why": by status and time; and by event.
    INDEX {{idx "dl_status_time_idx"}} (status, last_failed_at),
    INDEX {{idx "dl_time_idx"}} (last_failed_at),
    INDEX {{idx "dl_event_idx"}} (event_id),
    CONSTRAINT {{idx "dl_stage_check"}} CHECK (stage IN ('relay', 'consumer')),
    CONSTRAINT {{idx "dl_status_check"}} CHECK (status IN ('pending', 'replayed', 'discarded'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Claims lock this table's one row (SELECT ... FOR UPDATE) for the length of their
-- transaction, as PostgreSQL's claim function takes a transaction-scoped advisory lock.
CREATE TABLE IF NOT EXISTS {{.ClaimLock}} (
    id TINYINT NOT NULL,
    PRIMARY KEY (id)
) ENGINE = InnoDB;

INSERT IGNORE INTO {{.ClaimLock}} (id) VALUES (1);
