-- A consumer that holds keys (consumer.Config.HoldKeys) asks, for each keyed delivery,
-- whether the key has a pending dead letter of this consumer (the first index, by ID) or
-- was replayed since the event was published (the second, by replay time). Both hold
-- consumer-stage entries with a key only.
CREATE INDEX IF NOT EXISTS {{if .Schema}}{{quote .Schema}}.{{end}}{{idx "dead_letters_consumer_key_idx"}} ON {{quote (printf "%s_dead_letters" .Prefix)}} (consumer, event_key, status, id)
    WHERE stage = 'consumer' AND event_key <> '';
CREATE INDEX IF NOT EXISTS {{if .Schema}}{{quote .Schema}}.{{end}}{{idx "dead_letters_consumer_replayed_idx"}} ON {{quote (printf "%s_dead_letters" .Prefix)}} (consumer, event_key, status_changed_at)
    WHERE stage = 'consumer' AND event_key <> '' AND status = 'replayed';
