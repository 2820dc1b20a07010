package readmetest

import (
	"os"
	"strings"
)

// ReferenceNames returns every name that opens a row of a table in the
// file at path: the first cell's back-quoted names, split at commas.
func ReferenceNames(path string) (map[string]bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	rows := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if cells := strings.Split(line, "|"); len(cells) > 2 && strings.HasPrefix(line, "| `") {
			for _, name := range strings.Split(cells[1], ",") {
				rows[strings.Trim(strings.TrimSpace(name), "`")] = true
			}
		}
	}
	return rows, nil
}
