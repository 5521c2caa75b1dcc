package sqlstore

import (
	"strings"
	"testing"
)

// TestMySQLOwnerFitsTheColumn: the relay's name is written as 64 ASCII bytes at most
// (lease_owner is CHAR(64) ASCII, migration 007).
func TestMySQLOwnerFitsTheColumn(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"host:42:beef", "host:42:beef"},
		{"", ""},
		{"héte\n1", "h?te?1"},
		{strings.Repeat("a", 70), strings.Repeat("a", 64)},
		{strings.Repeat("é", 70), strings.Repeat("?", 64)},
	} {
		if got := mysqlOwner(c.in); got != c.want {
			t.Errorf("mysqlOwner(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
