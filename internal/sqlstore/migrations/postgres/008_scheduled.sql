-- Scheduled events (outbox.WithDeliverAt): Publish writes an event due later here instead of
-- into the outbox, so the claim never reads it; the relay's store moves due rows into the
-- outbox (in due order, as if they were published then) and Cancel deletes a row still here.
-- The claim's tables and functions are untouched: a million events due tomorrow cost
-- today's claims nothing.

CREATE TABLE {{.Scheduled}} (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id           uuid        NOT NULL,
    type         text        NOT NULL,
    key          text        NOT NULL DEFAULT '',
    headers      jsonb,
    content_type text        NOT NULL,
    body         bytea       NOT NULL,
    created_at   timestamptz NOT NULL,
    deliver_at   timestamptz NOT NULL
);

-- The move takes the due rows in due order; Stats reads the next due time from the front.
CREATE INDEX {{idx "scheduled_due_idx"}} ON {{.Scheduled}} (deliver_at, seq);
-- Cancel finds a scheduled event by its ID.
CREATE INDEX {{idx "scheduled_id_idx"}} ON {{.Scheduled}} (id);
