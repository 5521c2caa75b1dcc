package outboxtest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// Process is a server of a test's own — an emulator or a broker started from its binary
// or script — listening on a free loopback port, which the test may kill and start again
// on the same port: the shared services are never stopped. [StartProcess] starts it; it
// is killed when the test ends.
type Process struct {
	// Port is the loopback port the server listens on, the same across restarts.
	Port int

	t       testing.TB
	name    string
	command func(port int) *exec.Cmd
	timeout time.Duration
	logPath string
	cmd     *exec.Cmd
	exited  chan error
}

// StartProcess starts the server command(port) on a free port (command is called at each
// start: an exec.Cmd runs once) and waits until the port accepts connections, for up to
// startTimeout. The server's output goes to a log file in a temporary directory, shown
// when the test fails.
func StartProcess(t testing.TB, name string, startTimeout time.Duration, command func(port int) *exec.Cmd) *Process {
	t.Helper()
	p := &Process{Port: FreePort(t), t: t, name: name, command: command, timeout: startTimeout,
		logPath: filepath.Join(t.TempDir(), name+".log")}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			if b, err := os.ReadFile(p.logPath); err == nil {
				t.Logf("%s log (last 3000 bytes):\n%s", name, b[max(0, len(b)-3000):])
			}
		}
	})
	p.Start()
	return p
}

// FreePort returns a loopback TCP port that nothing listens on now.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start starts the server (again) on its port and waits until it accepts connections.
func (p *Process) Start() {
	t := p.t
	t.Helper()
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	p.cmd = p.command(p.Port)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", p.name, err)
	}
	p.exited = make(chan error, 1)
	go func(cmd *exec.Cmd, exited chan<- error) { exited <- cmd.Wait() }(p.cmd, p.exited)
	addr := fmt.Sprintf("127.0.0.1:%d", p.Port)
	deadline := time.Now().Add(p.timeout)
	for {
		select {
		case err := <-p.exited:
			p.exited <- err
			t.Fatalf("%s exited at start: %v (its log is below)", p.name, err)
		default:
		}
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not listen on %s within %v: %v", p.name, addr, p.timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Kill SIGKILLs the server, if it runs, and reaps it: its port refuses connections once
// Kill returns.
func (p *Process) Kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	if err := <-p.exited; err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			p.t.Errorf("waiting for %s: %v", p.name, err)
		}
	}
	p.cmd = nil
}

// StartNodeProcess starts, as [StartProcess] does, a server that runs on Node.js from the
// npm packages scripts/services/up.sh installs into scripts/services/node_modules (the
// emulators fauxqs and Azurite): argv(dir, port) returns node's arguments and extra
// environment, dir being scripts/services. Without node or the package, the test is
// skipped (failed when CI is set), as for a missing service.
func StartNodeProcess(t testing.TB, name, pkg string, argv func(dir string, port int) (args, env []string)) *Process {
	t.Helper()
	dir, err := servicesDir()
	var node string
	if err == nil {
		if _, err = os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err == nil {
			node, err = exec.LookPath("node")
		}
	}
	RequireService(t, "node with the "+pkg+" package (scripts/services/up.sh installs it)", err)
	return StartProcess(t, name, 60*time.Second, func(port int) *exec.Cmd {
		args, env := argv(dir, port)
		cmd := exec.Command(node, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), env...)
		return cmd
	})
}

// servicesDir finds scripts/services above the working directory (a test runs in its
// package's directory): the repository's root is the directory that holds go.work.
func servicesDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return filepath.Join(dir, "scripts", "services"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.work above the working directory: not in the txoutbox repository")
		}
		dir = parent
	}
}
