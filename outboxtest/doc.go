// Package outboxtest holds txoutbox's exported conformance suites, which every adapter and
// every transport runs against its real database or broker: [ExerciseStore] for relay stores
// and [ExerciseTransport] for senders and receivers. Third-party adapters and transports can
// run them too. It is for authors of stores and transports (the suites) and for test authors
// (RequireService, SkipIfShort, WaitFor and the fixtures).
package outboxtest

import (
	"os"
	"testing"
)

// RequireService reports a missing service: a test failure when the CI environment variable
// is set (a suite that skips everything proves nothing), a skip otherwise.
func RequireService(t testing.TB, name string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is not reachable (CI is set, so this fails instead of skipping): %v", name, err)
	}
	t.Skipf("%s is not reachable (start it with scripts/services/up.sh): %v", name, err)
}

// SkipIfShort skips a long test under go test -short, saying why; with the CI environment
// variable set it fails instead, since CI must run every test.
func SkipIfShort(t testing.TB, why string) {
	t.Helper()
	if !testing.Short() {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("-short would skip this test (%s), but CI is set: CI runs every test", why)
	}
	t.Skip(why)
}
