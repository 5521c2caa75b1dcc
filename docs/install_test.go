package docs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txoutbox/outbox/internal/readmetest"
	"github.com/txoutbox/outbox/outboxtest"
)

const base = "github.com/txoutbox/outbox"

// installed are the modules the outside module gets: the root, one adapter and one
// transport — those the README's snippets use.
var installed = []string{base, base + "/adapters/pgx", base + "/transports/sqs"}

// commandModules are the operator's command and the modules of ours it requires.
var commandModules = []string{base + "/cmd/outbox", base + "/adapters/sql", base + "/transports/azqueue",
	base + "/transports/kafka", base + "/transports/nats", base + "/transports/rabbitmq"}

// TestInstallFromTags proves the install story without publishing anything: it releases the
// committed HEAD in a clone (scripts/release.sh, at a version of its own), serves the
// clone's tags as a local module proxy (the go command fetching them with git, from the
// clone, into a module cache whose download directory is a GOPROXY=file:// tree), and in an
// outside module — not in go.work, GOWORK=off — runs `go get` for the root, outboxpgx and
// outboxsqs through that proxy, builds every Go snippet of the README as a program of its
// own, and runs those that are whole programs: the "check your install" program must relay
// its event. Third-party
// modules come from this machine's module cache, also as a file:// proxy, and only what is
// missing there from this machine's GOPROXY: the cache holds the versions the workspace
// selects, and an outside module may select others (golang.org/x/text v0.41.0 where the
// workspace has v0.43.0). The checksum database is off: the tagged modules are unknown to it.
func TestInstallFromTags(t *testing.T) {
	outboxtest.SkipIfShort(t, "builds a release and an outside module")
	ctx := context.Background()
	repo := strings.TrimSpace(run(t, "..", nil, "git", "rev-parse", "--show-toplevel"))
	if out := run(t, repo, nil, "git", "status", "--porcelain"); out != "" {
		t.Logf("uncommitted changes are not part of the release this test builds:\n%s", out)
	}
	tmp := t.TempDir()
	gomodcache := strings.TrimSpace(run(t, repo, nil, "go", "env", "GOMODCACHE"))
	hostProxy := strings.TrimSpace(run(t, repo, nil, "go", "env", "GOPROXY"))
	// The third-party modules the outside module needs, in this machine's cache (the only
	// step that may use the network, and only on a machine that never built these modules).
	for _, d := range []string{"adapters/pgx", "transports/sqs", "cmd/outbox"} {
		run(t, filepath.Join(repo, d), nil, "go", "mod", "download")
	}

	// Release the committed HEAD in a clone.
	version := fmt.Sprintf("v0.0.0-installtest.%d", time.Now().Unix())
	clone := filepath.Join(tmp, "repo")
	run(t, tmp, nil, "git", "clone", "-q", repo, clone)
	gitEnv := []string{"GIT_AUTHOR_NAME=install test", "GIT_AUTHOR_EMAIL=test@example.com",
		"GIT_COMMITTER_NAME=install test", "GIT_COMMITTER_EMAIL=test@example.com"}
	t.Log(strings.TrimSpace(run(t, clone, gitEnv, "scripts/release.sh", version)))

	// The local proxy: the go command fetches the tagged modules from the clone with git
	// (github.com/txoutbox/outbox rewritten to the clone) into a module cache of its own.
	gitconfig := filepath.Join(tmp, "gitconfig")
	if err := os.WriteFile(gitconfig, []byte("[url \"file://"+clone+"\"]\n\tinsteadOf = https://"+base+"\n[protocol \"file\"]\n\tallow = always\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	proxyCache := filepath.Join(tmp, "proxy")
	fetch := []string{"GOWORK=off", "GOFLAGS=-modcacherw", "GOMODCACHE=" + proxyCache, "GOPROXY=direct",
		"GOPRIVATE=" + base, "GIT_CONFIG_GLOBAL=" + gitconfig, "GIT_CONFIG_NOSYSTEM=1", "GOTOOLCHAIN=local"}
	var mods []string
	for _, m := range installed {
		mods = append(mods, m+"@"+version)
	}
	run(t, tmp, fetch, "go", append([]string{"mod", "download"}, mods...)...)
	var cmdMods []string // the operator's command and what it requires of ours
	for _, m := range commandModules {
		cmdMods = append(cmdMods, m+"@"+version)
	}
	run(t, tmp, fetch, "go", append([]string{"mod", "download"}, cmdMods...)...)
	proxy := "file://" + filepath.Join(proxyCache, "cache", "download")

	// The outside module.
	outside := filepath.Join(tmp, "outside")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "go.mod"), []byte("module example.com/outside\n\ngo 1.26.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"GOWORK=off", "GOFLAGS=-mod=mod -modcacherw", "GOMODCACHE=" + filepath.Join(tmp, "cache"),
		"GOPROXY=" + proxy + ",file://" + filepath.Join(gomodcache, "cache", "download") + "," + hostProxy,
		"GOSUMDB=off", "GOPRIVATE=", "GONOPROXY=", "GIT_CONFIG_GLOBAL=/dev/null", "GOTOOLCHAIN=local"}
	run(t, outside, env, "go", append([]string{"get"}, mods...)...)

	// The operator's command installs with go install at the release's version, as a static
	// binary, and says which version it is.
	bin := filepath.Join(tmp, "bin")
	run(t, outside, append(env, "GOBIN="+bin, "CGO_ENABLED=0"), "go", "install", base+"/cmd/outbox@"+version)
	if out := run(t, outside, nil, filepath.Join(bin, "outbox"), "version"); !strings.HasPrefix(out, "outbox "+version) {
		t.Fatalf("the installed command says %q, want its version %s", out, version)
	}
	var pkgs, programs []string
	for i, s := range readmetest.Snippets(t, "../README.md") {
		src, err := s.Program(imports)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(outside, fmt.Sprintf("snippet%02d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, "./"+filepath.Base(dir))
		if s.Whole() {
			programs = append(programs, "./"+filepath.Base(dir))
		}
	}
	run(t, outside, env, "go", "mod", "tidy")
	run(t, outside, env, "go", append([]string{"vet"}, pkgs...)...)
	t.Logf("%d README snippets compile in a module outside the repository, against %s", len(pkgs), version)

	// Run the README's programs (the snippets that are whole files; the others are parts of
	// a program, with stand-ins for what the page does not show), each against a schema of
	// its own.
	url := outboxtest.PostgresURL()
	pool, err := pgxpool.New(ctx, url)
	if err == nil {
		err = pool.Ping(ctx)
	}
	outboxtest.RequireService(t, "PostgreSQL", err)
	defer pool.Close()
	relayed := false
	for _, pkg := range programs {
		suffix := make([]byte, 6)
		_, _ = rand.Read(suffix)
		schema := "install_" + hex.EncodeToString(suffix)
		if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
			t.Fatal(err)
		}
		defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+schema+" CASCADE")
		sep := "?"
		if strings.Contains(url, "?") {
			sep = "&"
		}
		out := run(t, outside, append(env, "DATABASE_URL="+url+sep+"search_path="+schema), "go", "run", pkg)
		if strings.Contains(out, `relayed 1 event: {"name":"world"}`) {
			relayed = true
		}
	}
	if !relayed {
		t.Fatal(`no README program printed 'relayed 1 event: {"name":"world"}': the install check did not run`)
	}
}

// run runs name in dir with env added to the test's environment, and returns its output;
// a failure fails the test with the output.
func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s (in %s): %v\n%s", name, strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}
