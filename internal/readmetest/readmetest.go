// Package readmetest checks documentation against code: that a program prints what its
// README says it prints, and that the Go snippets of Markdown pages compile. It is internal
// to this repository's tests (docs/ and the examples).
package readmetest

import (
	"fmt"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"regexp"
	"slices"
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

// Snippet is one ```go block of a Markdown file.
type Snippet struct {
	// File and Line say where the block starts.
	File string
	Line int
	// Prelude is Go source the block needs and the page does not show: the declarations of
	// the variables it uses. It is the text of a "<!-- go: ... -->" comment on the lines
	// right before the block.
	Prelude string
	// Code is the block.
	Code string
}

// Snippets returns the ```go blocks of the Markdown file at path.
func Snippets(t testing.TB, path string) []Snippet {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	var out []Snippet
	for i := 0; i < len(lines); i++ {
		if strings.TrimSpace(lines[i]) != "```go" {
			continue
		}
		s := Snippet{File: path, Line: i + 1, Prelude: prelude(lines[:i])}
		var code []string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			code = append(code, lines[i])
		}
		if i == len(lines) {
			t.Fatalf("%s:%d: the ```go block is not closed", path, s.Line)
		}
		s.Code = strings.Join(code, "\n") + "\n"
		out = append(out, s)
	}
	return out
}

// prelude returns the text of the "<!-- go: ... -->" comment that ends right before the
// block (blank lines between them allowed), or "".
func prelude(before []string) string {
	end := len(before) - 1
	for end >= 0 && strings.TrimSpace(before[end]) == "" {
		end--
	}
	if end < 0 || !strings.HasSuffix(strings.TrimSpace(before[end]), "-->") {
		return ""
	}
	start := end
	for start >= 0 && !strings.HasPrefix(strings.TrimSpace(before[start]), "<!-- go:") {
		start--
	}
	if start < 0 {
		return ""
	}
	text := strings.Join(before[start:end+1], "\n")
	text = strings.TrimSuffix(strings.TrimSpace(text), "-->")
	return strings.TrimPrefix(strings.TrimSpace(text), "<!-- go:")
}

// Whole reports whether the snippet is a whole file: it starts with "package".
func (s Snippet) Whole() bool { return strings.HasPrefix(strings.TrimSpace(s.Code), "package ") }

// Program returns the snippet as the source of a package main: the block itself if it is a
// whole file (it starts with "package"); otherwise the prelude and the block — as they are
// if they are declarations, inside a function if they are statements — with the imports
// of imports (package name → path) that they use, and an empty main if they have none.
func (s Snippet) Program(imports map[string]string) (string, error) {
	if s.Whole() {
		return s.Code, nil
	}
	body := s.Prelude + "\n" + s.Code
	if _, err := parser.ParseFile(token.NewFileSet(), "", "package main\n"+body, 0); err != nil {
		body = s.Prelude + "\nfunc snippet() {\n" + s.Code + "}\n"
	}
	if !regexp.MustCompile(`(?m)^func main\(\)`).MatchString(body) {
		body += "\nfunc main() {}\n"
	}
	var b strings.Builder
	b.WriteString("package main\n\nimport (\n")
	for _, name := range slices.Sorted(maps.Keys(imports)) {
		if regexp.MustCompile(`\b` + name + `\.[A-Za-z]`).MatchString(body) {
			fmt.Fprintf(&b, "\t%s %q\n", name, imports[name])
		}
	}
	b.WriteString(")\n")
	b.WriteString(body)
	if _, err := parser.ParseFile(token.NewFileSet(), "", b.String(), 0); err != nil {
		return "", fmt.Errorf("%s:%d: %w", s.File, s.Line, err)
	}
	return b.String(), nil
}
