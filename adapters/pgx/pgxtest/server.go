package pgxtest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/outbox/outboxtest"
)

// Server is a PostgreSQL server of a test's own, in a temporary data directory, on a port
// of its own: unlike the shared server, the test may crash, stop and restart it.
type Server struct {
	bin, base, data, logfile string
	settings                 []string // -c settings beyond Start's
	port                     int
	asPostgres               bool // running as root: initdb and pg_ctl run as the postgres user
}

// StartServer initialises and starts a server (the newest /usr/lib/postgresql/*/bin; as
// root, run as the postgres user) with settings ("name=value", given to postgres -c)
// beyond its own; t's cleanup crashes it (if still running) and removes its directory,
// printing the server log if t failed. Without the server binaries it is
// outboxtest.RequireService's business: a failure when $CI is set, a skip otherwise.
func StartServer(t testing.TB, settings ...string) *Server {
	t.Helper()
	for _, set := range settings {
		if !settingRe.MatchString(set) {
			t.Fatalf("pgxtest: setting %q is not name=value", set)
		}
	}
	s, err := newPrivatePostgres()
	outboxtest.RequireService(t, "PostgreSQL server binaries (initdb)", err)
	s.settings = settings
	base, err := os.MkdirTemp("", "txoutbox-pg-") // under /tmp: traversable by the postgres user
	if err != nil {
		t.Fatal(err)
	}
	s.base, s.data, s.logfile = base, filepath.Join(base, "data"), filepath.Join(base, "server.log")
	t.Cleanup(func() {
		_ = s.pgctl("-m", "immediate", "stop") // fails harmlessly when the server is down
		if t.Failed() {
			if b, err := os.ReadFile(s.logfile); err == nil {
				t.Logf("server log:\n%s", b)
			}
		}
		_ = os.RemoveAll(base)
	})
	if s.asPostgres {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(base, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := s.command(filepath.Join(s.bin, "initdb"), "-D", s.data, "-A", "trust", "-U", "postgres",
		"--no-sync", "-E", "UTF8", "--locale=C").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.port = l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	return s
}

// settingRe is what StartServer accepts as a setting: no spaces or quotes for pg_ctl -o.
var settingRe = regexp.MustCompile(`^[a-z_.]+=[A-Za-z0-9_.:/-]+$`)

// LogicalSettings are the settings of a server whose log is read by logical replication
// (outboxpglog's tests): StartServer(t, LogicalSettings...).
var LogicalSettings = []string{"wal_level=logical", "max_replication_slots=10", "max_wal_senders=10"}

// newPrivatePostgres finds the server binaries (the newest major installed) and how to run
// them.
func newPrivatePostgres() (*Server, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { // by major version, newest first
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	s := &Server{asPostgres: os.Geteuid() == 0}
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			s.bin = d
			break
		}
	}
	if s.bin == "" {
		return nil, errors.New("no /usr/lib/postgresql/*/bin/initdb")
	}
	if s.asPostgres { // initdb refuses to run as root
		if _, err := exec.LookPath("runuser"); err != nil {
			return nil, fmt.Errorf("running as root without runuser: %w", err)
		}
		if _, err := user.Lookup("postgres"); err != nil {
			return nil, fmt.Errorf("running as root without a postgres user: %w", err)
		}
	}
	return s, nil
}

func (s *Server) command(name string, args ...string) *exec.Cmd {
	if s.asPostgres {
		args = append([]string{"-u", "postgres", "--", name}, args...)
		name = "runuser"
	}
	cmd := exec.Command(name, args...)
	cmd.Dir = s.base // the postgres user may not be able to enter the test's directory
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

func (s *Server) pgctl(args ...string) error {
	args = append([]string{"-D", s.data}, args...)
	if out, err := s.command(filepath.Join(s.bin, "pg_ctl"), args...).CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Start starts the server and waits until it accepts connections (after crash recovery,
// when it crashed). fsync stays on: that is what makes a crash meaningful.
func (s *Server) Start() error {
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=30 -c wal_writer_delay=10s", s.port, s.base)
	for _, set := range s.settings {
		opts += " -c " + set
	}
	return s.pgctl("-l", s.logfile, "-w", "-t", "60", "-o", opts, "start")
}

// Crash stops the server the way a crash does: immediate mode skips the shutdown checkpoint
// and the flush of WAL buffers, so the next start recovers from the WAL.
func (s *Server) Crash() error { return s.pgctl("-m", "immediate", "stop") }

// URL is the server's connection URL (user postgres, database postgres, no password).
func (s *Server) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// Stop shuts the server down cleanly (fast mode: sessions are ended, the shutdown
// checkpoint is written).
func (s *Server) Stop() error { return s.pgctl("-m", "fast", "stop") }

// LogFile is the path of the server's log.
func (s *Server) LogFile() string { return s.logfile }
