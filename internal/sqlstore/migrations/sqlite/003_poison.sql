-- Dead letters are stored whatever their content: a malformed message without a readable
-- event ID gets NULL (never a made-up all-zero UUID); kind classifies the failure for
-- filtering; broker_message_id finds a malformed message in the broker's logs; raw keeps
-- the entry as it came (deadletter.Raw's text) when it had to be changed to be stored.
-- SQLite cannot drop a NOT NULL constraint, so the table is rebuilt (in the migration's
-- transaction: SQLite's DDL is transactional).

CREATE TABLE {{if .Schema}}{{quote .Schema}}.{{end}}{{quote (printf "%s_dead_letters_003" .Prefix)}} (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id          TEXT,
    event_type        TEXT    NOT NULL,
    event_key         TEXT    NOT NULL DEFAULT '',
    headers           TEXT,
    content_type      TEXT    NOT NULL DEFAULT '',
    body              BLOB    NOT NULL,
    created_at        TEXT    NOT NULL,
    stage             TEXT    NOT NULL CHECK (stage IN ('relay', 'consumer')),
    kind              TEXT    NOT NULL DEFAULT '',
    consumer          TEXT    NOT NULL DEFAULT '',
    reason            TEXT    NOT NULL,
    attempts          INTEGER NOT NULL,
    first_failed_at   TEXT    NOT NULL,
    last_failed_at    TEXT    NOT NULL,
    status            TEXT    NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'replayed', 'discarded')),
    status_changed_at TEXT,
    broker_message_id TEXT    NOT NULL DEFAULT '',
    raw               BLOB
);

-- Earlier malformed messages were stored with the all-zero UUID; earlier entries are
-- classified by the reasons the relay and the consumer wrote.
INSERT INTO {{if .Schema}}{{quote .Schema}}.{{end}}{{quote (printf "%s_dead_letters_003" .Prefix)}}
       (id, event_id, event_type, event_key, headers, content_type, body, created_at, stage, kind,
        consumer, reason, attempts, first_failed_at, last_failed_at, status, status_changed_at)
SELECT id, NULLIF(event_id, '00000000-0000-0000-0000-000000000000'), event_type, event_key, headers,
       content_type, body, created_at, stage,
       CASE WHEN reason LIKE 'undecodable message:%' THEN 'malformed'
            WHEN reason LIKE 'no handler for event type %' THEN 'unknown-type'
            WHEN reason LIKE 'gave up after %' OR reason LIKE 'claimed % times without an outcome%' THEN 'gave-up'
            ELSE '' END,
       consumer, reason, attempts, first_failed_at, last_failed_at, status, status_changed_at
  FROM {{.DeadLetters}};

DROP TABLE {{.DeadLetters}};

ALTER TABLE {{if .Schema}}{{quote .Schema}}.{{end}}{{quote (printf "%s_dead_letters_003" .Prefix)}} RENAME TO {{quote (printf "%s_dead_letters" .Prefix)}};

CREATE INDEX IF NOT EXISTS {{if .Schema}}{{quote .Schema}}.{{end}}{{idx "dead_letters_status_time_idx"}} ON {{quote (printf "%s_dead_letters" .Prefix)}} (status, last_failed_at);
CREATE INDEX IF NOT EXISTS {{if .Schema}}{{quote .Schema}}.{{end}}{{idx "dead_letters_time_idx"}} ON {{quote (printf "%s_dead_letters" .Prefix)}} (last_failed_at);
CREATE INDEX IF NOT EXISTS {{if .Schema}}{{quote .Schema}}.{{end}}{{idx "dead_letters_event_idx"}} ON {{quote (printf "%s_dead_letters" .Prefix)}} (event_id);
CREATE INDEX IF NOT EXISTS {{if .Schema}}{{quote .Schema}}.{{end}}{{idx "dead_letters_broker_msg_idx"}} ON {{quote (printf "%s_dead_letters" .Prefix)}} (broker_message_id) WHERE broker_message_id <> '';
