package cluster_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestClaimsTableNamesRealTests checks docs/claims.md: every test its
// "Proven" tables (every section whose heading starts with "Proven") name is
// a test function of the file the row gives, and the README links the
// page.
func TestClaimsTableNamesRealTests(t *testing.T) {
	const root = "../.."
	doc, err := os.ReadFile(filepath.Join(root, "docs", "claims.md"))
	if err != nil {
		t.Fatal(err)
	}
	// Every section whose heading starts with "Proven" holds rows.
	sections := strings.Split(string(doc), "\n## ")
	proven := 0
	rows := 0
	for _, sec := range sections[1:] {
		if !strings.HasPrefix(sec, "Proven") {
			continue
		}
		proven++
		rows += checkRows(t, root, sec)
	}
	if proven == 0 {
		t.Fatal(`docs/claims.md has no "## Proven" section`)
	}
	if rows == 0 {
		t.Error(`docs/claims.md: no rows in the "Proven" table`)
	}
	if !strings.Contains(string(doc), "\n## Not yet proven\n") {
		t.Error(`docs/claims.md has no "## Not yet proven" section`)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "(docs/claims.md)") {
		t.Error("README.md does not link docs/claims.md")
	}
}

// checkRows checks the table rows of one section and returns how many
// there are.
func checkRows(t *testing.T, root, section string) int {
	t.Helper()
	rows := 0
	for _, line := range strings.Split(section, "\n") {
		// | claim | `TestA`, `TestB` | `dir/file_test.go` |, with \| inside a cell.
		cells := strings.Split(strings.ReplaceAll(line, `\|`, ""), "|")
		if len(cells) != 5 || !strings.HasPrefix(strings.TrimSpace(cells[2]), "`") {
			continue
		}
		rows++
		cells[1] = strings.TrimSpace(cells[1])
		file := strings.Trim(strings.TrimSpace(cells[3]), "`")
		if !strings.HasSuffix(file, "_test.go") {
			t.Errorf("row %q: %q is not a test file", cells[1], file)
			continue
		}
		src, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Errorf("row %q: %v", cells[1], err)
			continue
		}
		names := strings.Split(cells[2], ",")
		for _, n := range names {
			name := strings.Trim(strings.TrimSpace(n), "`")
			if !regexp.MustCompile(`^Test[A-Z0-9_]\w*$`).MatchString(name) {
				t.Errorf("row %q: %q is not a test name", cells[1], name)
				continue
			}
			if !regexp.MustCompile(`(?m)^func ` + name + `\(t \*testing\.T\) \{`).Match(src) {
				t.Errorf("row %q: no func %s in %s", cells[1], name, file)
			}
		}
	}
	return rows
}
