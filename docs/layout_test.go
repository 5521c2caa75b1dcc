package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestLayoutTableMatchesTree checks the README's layout table against the repository: every
// directory holding Go files (a package, a command, an example, a test-only package) must be
// named in the first column of a row, and every path the column names must be such a
// directory. "/" is the repository's root. The tree is read at each run, so a package added
// or removed fails this test until the table says so.
func TestLayoutTableMatchesTree(t *testing.T) {
	named := layoutPaths(t, "../README.md")
	tree := goDirs(t, "..")
	for _, dir := range tree {
		if !slices.Contains(named, dir) {
			t.Errorf("README.md's layout table does not name %s, a directory with Go files: add it to a row", dir)
		}
	}
	for _, p := range named {
		if !slices.Contains(tree, p) {
			t.Errorf("README.md's layout table names %s, which is not a directory with Go files: remove or correct it", p)
		}
	}
}

// layoutPaths returns the paths named (in backquotes) in the first column of the table under
// the "## Layout" heading of the Markdown file at path.
func layoutPaths(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Layout\n")
	if !ok {
		t.Fatalf("%s has no \"## Layout\" section", path)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	code := regexp.MustCompile("`([^`]+)`")
	var paths []string
	rows := 0
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "|") || len(cells) < 3 || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") {
			continue
		}
		rows++
		if rows == 1 {
			continue // the header
		}
		for _, m := range code.FindAllStringSubmatch(cells[1], -1) {
			p := m[1]
			if p != "/" {
				p = strings.Trim(p, "/")
			}
			if slices.Contains(paths, p) {
				t.Errorf("%s's layout table names %s twice", path, p)
			}
			paths = append(paths, p)
		}
	}
	if len(paths) == 0 {
		t.Fatalf("%s's layout table names no path: the test proves nothing", path)
	}
	return paths
}

// goDirs returns the directories under root that hold .go files, relative to root with
// slashes ("/" for root itself), skipping what the go command ignores: testdata and names
// starting with "." or "_".
func goDirs(t *testing.T, root string) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == "." {
			rel = "/"
		}
		if !slices.Contains(dirs, rel) {
			dirs = append(dirs, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}
