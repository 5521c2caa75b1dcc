package outboxtest

import (
	"net/http"
	"net/url"
	"os"
	"strconv"
)

// Where the tests find each service: the environment variable when it is set, otherwise
// the loopback address scripts/services/up.sh starts the service on. One place for every
// module's tests, so that pointing the suite at other servers is one variable per service.

// PostgresURL is $TXOUTBOX_PG_URL or the local test database.
func PostgresURL() string {
	return envOr("TXOUTBOX_PG_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

// MySQLDSN is $TXOUTBOX_MYSQL_DSN or the local test database (go-sql-driver/mysql form).
func MySQLDSN() string {
	return envOr("TXOUTBOX_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test?parseTime=true&multiStatements=true")
}

// NATSURL is $TXOUTBOX_NATS_URL or the local nats-server (JetStream enabled).
func NATSURL() string { return envOr("TXOUTBOX_NATS_URL", "nats://127.0.0.1:4222") }

// AMQPURL is $TXOUTBOX_AMQP_URL or the local RabbitMQ node.
func AMQPURL() string { return envOr("TXOUTBOX_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/") }

// SQSEndpoint is $TXOUTBOX_SQS_ENDPOINT or the local SQS emulator (fauxqs).
func SQSEndpoint() string { return envOr("TXOUTBOX_SQS_ENDPOINT", "http://127.0.0.1:4566") }

// AzuriteConnString is $TXOUTBOX_AZURITE_CONN or the local Azurite's queue service with
// its well-known development account (public, documented by Microsoft: not a secret).
func AzuriteConnString() string {
	return envOr("TXOUTBOX_AZURITE_CONN", AzuriteDevConnString(10001))
}

// AzuriteBlobConnString is $TXOUTBOX_AZURITE_BLOB_CONN or the local Azurite's blob service
// (127.0.0.1:10000) with the well-known development account.
func AzuriteBlobConnString() string {
	return envOr("TXOUTBOX_AZURITE_BLOB_CONN", azuriteDevAccount+"BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;")
}

// azuriteDevAccount is the start of a connection string with Azurite's well-known
// development account.
const azuriteDevAccount = "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;" +
	"AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"

// S3Endpoint is $TXOUTBOX_S3_ENDPOINT or the local S3 emulator (moto_server; path-style
// addressing, any credentials).
func S3Endpoint() string { return envOr("TXOUTBOX_S3_ENDPOINT", "http://127.0.0.1:5000") }

// AzuriteDevConnString is the connection string of an Azurite queue service on
// 127.0.0.1:port with the well-known development account: for a private Azurite a test
// starts itself (outboxtest.StartNodeProcess).
func AzuriteDevConnString(port int) string {
	return azuriteDevAccount + "QueueEndpoint=http://127.0.0.1:" + strconv.Itoa(port) + "/devstoreaccount1;"
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Shown is a service URL as test messages may print it: its password, if any, replaced by
// "xxxxx" (URLs come from the environment, and a CI log is no place for a secret).
func Shown(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(a URL that does not parse)"
	}
	return u.Redacted()
}

// ClosingIdle wraps m so that once its tests ran, the idle connections of each transport are
// closed: their read and write loops would otherwise count as leaked goroutines in
// goleak.VerifyTestMain(outboxtest.ClosingIdle(m, transport)).
func ClosingIdle(m interface{ Run() int }, transports ...*http.Transport) interface{ Run() int } {
	return closingIdle{m, transports}
}

type closingIdle struct {
	m          interface{ Run() int }
	transports []*http.Transport
}

func (c closingIdle) Run() int {
	code := c.m.Run()
	for _, t := range c.transports {
		t.CloseIdleConnections()
	}
	return code
}
