-- Keyless rows in outbox order, for claims that look past a window of keyed rows (see
-- runs.go). Statements end with ';' at the end of a line (see splitStatements).
CREATE INDEX IF NOT EXISTS {{if .Schema}}{{quote .Schema}}.{{end}}{{idx "keyless_seq_idx"}} ON {{quote .Prefix}} (seq) WHERE "key" = '';
