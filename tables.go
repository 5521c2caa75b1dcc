package outbox

// Tables names the tables the SQL adapters use. The zero value means the connection's
// default schema (search_path on PostgreSQL, the connected database on MySQL) and an outbox
// table named "outbox"; the dead-letter, inbox and migration tables take the outbox table's
// name as their prefix ("outbox_dead_letters"…). Names must be plain identifiers
// (letters, digits, underscores; not starting with a digit; Outbox at most 40 characters).
type Tables struct {
	// Schema is the schema (MySQL: the database) of every table; "" is the connection's
	// default.
	Schema string
	// Outbox is the outbox table's name and the prefix of the others; "" is "outbox".
	Outbox string
}
