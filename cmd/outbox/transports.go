package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue/v2"
	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/outbox"
	outboxazqueue "github.com/txoutbox/outbox/transports/azqueue"
	outboxkafka "github.com/txoutbox/outbox/transports/kafka"
	outboxnats "github.com/txoutbox/outbox/transports/nats"
	outboxrabbitmq "github.com/txoutbox/outbox/transports/rabbitmq"
	outboxsqs "github.com/txoutbox/outbox/transports/sqs"
)

// transportHelp is the help of --transport, also in README.md.
const transportHelp = `the broker, by URL:
  sqs://QUEUE?region=R[&endpoint=URL]        AWS SQS (credentials: the AWS SDK's usual environment and files);
                                             QUEUE is a queue name (FIFO: name.fifo); routes name queues or queue URLs
  azqueue://QUEUE                            Azure Queue Storage; the account from AZURE_STORAGE_CONNECTION_STRING
  nats://[user:pass@]HOST:4222[,HOST2]?stream=S&subject-prefix=P   NATS JetStream; routes name subjects
  kafka://BROKER:9092[,BROKER2]?topic=T      Kafka; routes name topics
  amqp://user:pass@HOST:5672/VHOST?exchange=X  RabbitMQ (amqps:// for TLS); routes name routing keys
  memory://                                  an in-process sink that logs each event, for trials`

// transport is an open broker connection for the relay.
type transport struct {
	sender outbox.Sender
	shown  string // the URL without secrets
	// close releases the connection after the relay stopped.
	close func() error
}

// openTransport connects to the broker raw names, routing event types by routes (type →
// queue, subject, topic or routing key). Secrets in raw are recorded with r.
func (a *app) openTransport(ctx context.Context, raw string, routes map[string]string, log *slog.Logger) (*transport, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, usagef("--transport: %v", a.stderr.hideURLError(raw, err))
	}
	a.stderr.addURL(u)
	shown := redactURL(u)
	q := u.Query()
	param := func(name string) string { v := q.Get(name); q.Del(name); return v }
	none := func() error { return nil }
	switch u.Scheme {
	case "memory":
		return &transport{sender: &logSink{log: log}, shown: "memory://", close: none}, nil

	case "sqs":
		region, endpoint := param("region"), param("endpoint")
		if err := unknownParams(q); err != nil {
			return nil, err
		}
		cfg, err := awsconfig.LoadDefaultConfig(ctx)
		if err != nil {
			return nil, fmt.Errorf("--transport %s: loading the AWS configuration: %w", shown, a.stderr.hide(err))
		}
		if region != "" {
			cfg.Region = region
		}
		if cfg.Region == "" {
			return nil, usagef("--transport %s: no AWS region: add ?region= or set AWS_REGION", shown)
		}
		client := sqs.NewFromConfig(cfg, func(o *sqs.Options) {
			if endpoint != "" {
				o.BaseEndpoint = aws.String(endpoint)
			}
		})
		resolve := func(queue string) (string, error) {
			if strings.HasPrefix(queue, "https://") || strings.HasPrefix(queue, "http://") {
				return queue, nil
			}
			out, err := client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(queue)})
			if err != nil {
				return "", fmt.Errorf("--transport %s: finding queue %q: %w", shown, queue, a.stderr.hide(err))
			}
			return aws.ToString(out.QueueUrl), nil
		}
		sc := outboxsqs.SenderConfig{Routes: map[string]string{}}
		if u.Host != "" {
			if sc.QueueURL, err = resolve(u.Host); err != nil {
				return nil, err
			}
		}
		for typ, queue := range routes {
			if sc.Routes[typ], err = resolve(queue); err != nil {
				return nil, err
			}
		}
		s, err := outboxsqs.NewSender(client, &sc)
		if err != nil {
			return nil, usagef("--transport %s: %v", shown, err)
		}
		return &transport{sender: s, shown: shown, close: none}, nil

	case "azqueue":
		if err := unknownParams(q); err != nil {
			return nil, err
		}
		conn := a.getenv("AZURE_STORAGE_CONNECTION_STRING")
		if conn == "" {
			return nil, usagef("--transport %s: set AZURE_STORAGE_CONNECTION_STRING to the storage account's connection string", shown)
		}
		a.stderr.addConnectionString(conn)
		client, err := azqueue.NewServiceClientFromConnectionString(conn, &azqueue.ClientOptions{
			ClientOptions: azcore.ClientOptions{Transport: &http.Client{Timeout: time.Minute}},
		})
		if err != nil {
			return nil, fmt.Errorf("AZURE_STORAGE_CONNECTION_STRING: %w", a.stderr.hide(err))
		}
		s, err := outboxazqueue.NewSender(client, &outboxazqueue.SenderConfig{DefaultQueue: u.Host, Routes: routes})
		if err != nil {
			return nil, usagef("--transport %s: %v", shown, err)
		}
		return &transport{sender: s, shown: shown, close: none}, nil

	case "nats", "tls":
		cfg := outboxnats.SenderConfig{SubjectPrefix: param("subject-prefix"), Stream: param("stream"), Subjects: routes}
		var opts []nats.Option
		if creds := param("creds"); creds != "" {
			opts = append(opts, nats.UserCredentials(creds))
		}
		if err := unknownParams(q); err != nil {
			return nil, err
		}
		c := *u
		c.RawQuery = ""
		var servers []string
		for _, host := range strings.Split(c.Host, ",") {
			s := c
			s.Host = host
			servers = append(servers, s.String())
		}
		opts = append(opts, nats.Name("txoutbox relay"), nats.MaxReconnects(-1))
		nc, err := nats.Connect(strings.Join(servers, ","), opts...)
		if err != nil {
			return nil, fmt.Errorf("--transport %s: %w", shown, a.stderr.hide(err))
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, err
		}
		s, err := outboxnats.NewSender(js, &cfg)
		if err != nil {
			nc.Close()
			return nil, usagef("--transport %s: %v", shown, err)
		}
		return &transport{sender: s, shown: shown, close: func() error { return nc.Drain() }}, nil

	case "kafka":
		cfg := outboxkafka.SenderConfig{Topic: param("topic"), Routes: routes}
		if err := unknownParams(q); err != nil {
			return nil, err
		}
		if u.Host == "" {
			return nil, usagef("--transport %s names no broker", shown)
		}
		cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(u.Host, ",")...), kgo.ProducerLinger(0))
		if err != nil {
			return nil, usagef("--transport %s: %v", shown, a.stderr.hide(err))
		}
		s, err := outboxkafka.NewSender(cl, &cfg)
		if err != nil {
			cl.Close()
			return nil, usagef("--transport %s: %v", shown, err)
		}
		return &transport{sender: s, shown: shown, close: func() error { cl.Close(); return nil }}, nil

	case "amqp", "amqps":
		cfg := outboxrabbitmq.SenderConfig{Exchange: param("exchange"), RoutingKeys: routes}
		if err := unknownParams(q); err != nil {
			return nil, err
		}
		c := *u
		c.RawQuery = ""
		s, err := outboxrabbitmq.NewSender(outboxrabbitmq.Connection{URL: c.String()}, &cfg)
		if err != nil {
			return nil, usagef("--transport %s: %v", shown, a.stderr.hide(err))
		}
		return &transport{sender: s, shown: shown, close: s.Close}, nil
	}
	return nil, usagef("--transport: unknown scheme %q: want sqs://, azqueue://, nats://, kafka://, amqp:// or memory://", u.Scheme)
}

// unknownParams fails on URL parameters left after a transport took its own.
func unknownParams(q url.Values) error {
	var names []string
	for name := range q {
		names = append(names, name)
	}
	if len(names) > 0 {
		return usagef("--transport: unknown parameter(s) %s", strings.Join(names, ", "))
	}
	return nil
}

// parseRoutes reads --route TYPE=DESTINATION flags.
func parseRoutes(routes []string) (map[string]string, error) {
	out := map[string]string{}
	var errs []error
	for _, r := range routes {
		typ, dest, ok := strings.Cut(r, "=")
		switch {
		case !ok || typ == "" || dest == "":
			errs = append(errs, fmt.Errorf("--route %q: want TYPE=DESTINATION", r))
		case out[typ] != "":
			errs = append(errs, fmt.Errorf("--route %q: type %q is routed twice", r, typ))
		default:
			out[typ] = dest
		}
	}
	if len(errs) > 0 {
		return nil, usageError{errors.Join(errs...)}
	}
	return out, nil
}

// stringsFlag collects a repeated flag.
type stringsFlag []string

func (f *stringsFlag) String() string     { return strings.Join(*f, ", ") }
func (f *stringsFlag) Set(s string) error { *f = append(*f, s); return nil }

// logSink is the memory:// transport: it logs each event and keeps nothing.
type logSink struct{ log *slog.Logger }

func (s *logSink) Send(ctx context.Context, msgs []outbox.Message) error {
	for _, m := range msgs {
		s.log.InfoContext(ctx, "delivered", "event_id", m.ID, "type", m.Type, "key", m.Key, "bytes", len(m.Body))
	}
	return nil
}

func (s *logSink) MessagingSystem() string                 { return "memory" }
func (s *logSink) DestinationName(m outbox.Message) string { return "memory" }
