module github.com/txoutbox/outbox/docs

go 1.26.0
