-- Scheduled events (outbox.WithDeliverAt): Publish writes an event due later here instead of
-- into the outbox, so the claim never reads it; the relay's store moves due rows into the
-- outbox (in due order, as if they were published then) and Cancel deletes a row still here.
-- deliver_at is UTC text like every time here, compared with SQLite's own clock.

CREATE TABLE IF NOT EXISTS {{.Scheduled}} (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT    NOT NULL,
    type         TEXT    NOT NULL,
    "key"        TEXT    NOT NULL DEFAULT '',
    headers      TEXT,
    content_type TEXT    NOT NULL,
    body         BLOB    NOT NULL,
    created_at   TEXT    NOT NULL,
    deliver_at   TEXT    NOT NULL
);

CREATE INDEX IF NOT EXISTS {{if .Schema}}{{quote .Schema}}.{{end}}{{idx "scheduled_due_idx"}} ON {{quote (printf "%s_scheduled" .Prefix)}} (deliver_at, seq);
CREATE INDEX IF NOT EXISTS {{if .Schema}}{{quote .Schema}}.{{end}}{{idx "scheduled_id_idx"}} ON {{quote (printf "%s_scheduled" .Prefix)}} (id);
