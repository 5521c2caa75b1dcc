// Package readmetest lets the examples' tests check that a program prints what its README
// says it prints.
package readmetest

import (
	"os"
	"strings"
	"testing"
)

// Output returns the fenced block that follows the marker line (such as
// "<!-- output -->") in the Markdown file at path.
func Output(t testing.TB, path, marker string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), marker+"\n```")
	if !ok {
		t.Fatalf("%s has no %q line followed by a fenced block", path, marker)
	}
	_, block, _ := strings.Cut(after, "\n") // the rest of the opening fence line
	block, _, ok = strings.Cut(block, "```")
	if !ok {
		t.Fatalf("%s: the block after %q is not closed", path, marker)
	}
	return block
}
