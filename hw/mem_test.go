package hw

import (
	"os"
	"path/filepath"
	"testing"
)

func TestMemTotal(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "meminfo")
	os.WriteFile(good, []byte("MemFree:  100 kB\nMemTotal:       2048 kB\n"), 0o644)
	if n, err := memTotal(good); err != nil || n != 2048<<10 {
		t.Errorf("memTotal = %d, %v; want %d", n, err, 2048<<10)
	}
	bad := filepath.Join(dir, "bad")
	os.WriteFile(bad, []byte("MemFree: 1 kB\n"), 0o644)
	if _, err := memTotal(bad); err == nil {
		t.Errorf("memTotal without a MemTotal line: no error")
	}
	if _, err := MemTotal(t.TempDir()); err == nil {
		t.Errorf("MemTotal of a root without proc/meminfo: no error")
	}
	if n, err := MemTotal("/"); err != nil || n <= 0 {
		t.Errorf("MemTotal(/) on this machine = %d, %v", n, err)
	}
}
