package hw

import (
	"os"
	"path/filepath"
	"strings"
)

// The readers in this package take the machine's root ("/" in production, a fixture tree under
// testdata/ in tests) and a fixed path below it, so the same code reads a Raspberry Pi's /proc and
// /sys on an x86 build machine. No path comes from outside the package.

// readValue reads root/rel and returns its content trimmed of surrounding white space and the
// NUL bytes device-tree strings end with; ok is false when the file is absent or unreadable, or
// holds nothing but those.
func readValue(root, rel string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		return "", false
	}
	s := strings.TrimSpace(strings.Trim(string(b), "\x00"))
	return s, s != ""
}

// firstValue is readValue of the first of rels that has a value.
func firstValue(root string, rels ...string) (string, bool) {
	for _, rel := range rels {
		if v, ok := readValue(root, rel); ok {
			return v, true
		}
	}
	return "", false
}
