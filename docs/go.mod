module github.com/txoutbox/outbox/docs

go 1.26.0

require (
	github.com/jackc/pgx/v5 v5.12.0
	github.com/txoutbox/outbox v0.1.0
)
