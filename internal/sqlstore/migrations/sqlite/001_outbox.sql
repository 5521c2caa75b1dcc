-- The outbox and the dead-letter table (SQLite 3.35+: RETURNING, UPDATE ... FROM, json_each).
-- Times are UTC text 'YYYY-MM-DD HH:MM:SS.SSS', which sorts like the times it names; the
-- relay's leases and delays use SQLite's own clock (strftime(..., 'now')). Statements end
-- with ';' at the end of a line (see splitStatements). An index lives in its table's schema,
-- so it is named with the schema and created on the bare table name.

CREATE TABLE IF NOT EXISTS {{.Outbox}} (
    -- AUTOINCREMENT: a seq is never reused, even after the newest row is deleted.
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    id              TEXT    NOT NULL,
    type            TEXT    NOT NULL,
    "key"           TEXT    NOT NULL DEFAULT '',
    headers         TEXT,
    content_type    TEXT    NOT NULL,
    body            BLOB    NOT NULL,
    created_at      TEXT    NOT NULL,
    available_at    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    claim_token     INTEGER,
    lease_owner     TEXT,
    lease_until     TEXT,
    first_failed_at TEXT,
    last_error      TEXT
);

-- Serves the claim's "no earlier message of this key is leased or waiting" check.
CREATE INDEX IF NOT EXISTS {{if .Schema}}{{quote .Schema}}.{{end}}{{idx "key_seq_idx"}} ON {{quote .Prefix}} ("key", seq) WHERE "key" <> '';

CREATE TABLE IF NOT EXISTS {{.DeadLetters}} (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id          TEXT    NOT NULL,
    event_type        TEXT    NOT NULL,
    event_key         TEXT    NOT NULL DEFAULT '',
    headers           TEXT,
    content_type      TEXT    NOT NULL DEFAULT '',
    body              BLOB    NOT NULL,
    created_at        TEXT    NOT NULL,
    stage             TEXT    NOT NULL CHECK (stage IN ('relay', 'consumer')),
    consumer          TEXT    NOT NULL DEFAULT '',
    reason            TEXT    NOT NULL,
    attempts          INTEGER NOT NULL,
    first_failed_at   TEXT    NOT NULL,
    last_failed_at    TEXT    NOT NULL,
    status            TEXT    NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'replayed', 'discarded')),
    status_changed_at TEXT
);

-- "What failed since yesterday, and why": by status and time; and by event.
CREATE INDEX IF NOT EXISTS {{if .Schema}}{{quote .Schema}}.{{end}}{{idx "dead_letters_status_time_idx"}} ON {{quote (printf "%s_dead_letters" .Prefix)}} (status, last_failed_at);
CREATE INDEX IF NOT EXISTS {{if .Schema}}{{quote .Schema}}.{{end}}{{idx "dead_letters_time_idx"}} ON {{quote (printf "%s_dead_letters" .Prefix)}} (last_failed_at);
CREATE INDEX IF NOT EXISTS {{if .Schema}}{{quote .Schema}}.{{end}}{{idx "dead_letters_event_idx"}} ON {{quote (printf "%s_dead_letters" .Prefix)}} (event_id);
