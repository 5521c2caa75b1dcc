// Package docs holds the documentation pages of txoutbox (this directory's Markdown files)
// and the test that compiles every Go snippet of them and of the READMEs.
package docs

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/txoutbox/outbox/internal/readmetest"
)

// imports are the packages snippets may use without importing them, by name.
var imports = map[string]string{
	"context":       "context",
	"errors":        "errors",
	"fmt":           "fmt",
	"http":          "net/http",
	"log":           "log",
	"os":            "os",
	"slog":          "log/slog",
	"sql":           "database/sql",
	"time":          "time",
	"pgx":           "github.com/jackc/pgx/v5",
	"pgxpool":       "github.com/jackc/pgx/v5/pgxpool",
	"gorm":          "gorm.io/gorm",
	"bun":           "github.com/uptrace/bun",
	"sqs":           "github.com/aws/aws-sdk-go-v2/service/sqs",
	"outbox":        "github.com/txoutbox/outbox",
	"consumer":      "github.com/txoutbox/outbox/consumer",
	"deadletter":    "github.com/txoutbox/outbox/deadletter",
	"idempotency":   "github.com/txoutbox/outbox/idempotency",
	"outboxdriver":  "github.com/txoutbox/outbox/outboxdriver",
	"relay":         "github.com/txoutbox/outbox/relay",
	"outboxmemory":  "github.com/txoutbox/outbox/transports/memory",
	"outboxpgx":     "github.com/txoutbox/outbox/adapters/pgx",
	"outboxpglog":   "github.com/txoutbox/outbox/adapters/pgx/pglog",
	"outboxgorm":    "github.com/txoutbox/outbox/adapters/gorm",
	"outboxbun":     "github.com/txoutbox/outbox/adapters/bun",
	"outboxsql":     "github.com/txoutbox/outbox/adapters/sql",
	"outboxsqs":     "github.com/txoutbox/outbox/transports/sqs",
	"outboxnats":    "github.com/txoutbox/outbox/transports/nats",
	"outboxazqueue": "github.com/txoutbox/outbox/transports/azqueue",
	"outboxkafka":   "github.com/txoutbox/outbox/transports/kafka",
	"claimcheck":    "github.com/txoutbox/outbox/claimcheck",
	"claimchecks3":  "github.com/txoutbox/outbox/claimcheck/s3",
	"s3":            "github.com/aws/aws-sdk-go-v2/service/s3",
	"kgo":           "github.com/twmb/franz-go/pkg/kgo",
	"nats":          "github.com/nats-io/nats.go",
	"jetstream":     "github.com/nats-io/nats.go/jetstream",
	"otel":          "go.opentelemetry.io/otel",
	"propagation":   "go.opentelemetry.io/otel/propagation",
	"sdktrace":      "go.opentelemetry.io/otel/sdk/trace",
	"sdkmetric":     "go.opentelemetry.io/otel/sdk/metric",
	"otelprom":      "go.opentelemetry.io/otel/exporters/prometheus",
	"promhttp":      "github.com/prometheus/client_golang/prometheus/promhttp",
}

// pages are the Markdown files whose snippets must compile.
func pages(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, pattern := range []string{"../README.md", "*.md", "transports/*.md", "../examples/*/README.md", "../transports/*/README.md", "../adapters/*/README.md"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m...)
	}
	return out
}

// TestSnippetsCompile compiles every Go snippet of the documentation, each as a
// program of its own with its page's prelude (see readmetest.Snippet).
func TestSnippetsCompile(t *testing.T) {
	dir := t.TempDir()
	overlay := map[string]string{}
	var pkgs []string
	where := map[string]readmetest.Snippet{}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for _, page := range pages(t) {
		for _, s := range readmetest.Snippets(t, page) {
			src, err := s.Program(imports)
			if err != nil {
				t.Fatal(err)
			}
			pkg := fmt.Sprintf("_snippets/%03d", len(pkgs))
			file := filepath.Join(dir, strings.ReplaceAll(pkg, "/", "_")+".go")
			if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			overlay[filepath.Join(wd, pkg, "main.go")] = file
			pkgs = append(pkgs, "./"+pkg)
			where[pkg] = s
		}
	}
	if len(pkgs) == 0 {
		t.Fatal("no Go snippets found: the test proves nothing")
	}
	b, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	ovl := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(ovl, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", append([]string{"build", "-overlay=" + ovl}, pkgs...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		for pkg, s := range where {
			if strings.Contains(string(out), pkg) {
				src, _ := s.Program(imports)
				t.Errorf("%s:%d: this snippet does not compile; as a program (%s/main.go):\n%s", s.File, s.Line, pkg, numbered(src))
			}
		}
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Logf("%d snippets compile", len(pkgs))
}

func numbered(src string) string {
	var b strings.Builder
	for i, l := range strings.Split(src, "\n") {
		fmt.Fprintf(&b, "%4d  %s\n", i+1, l)
	}
	return b.String()
}
