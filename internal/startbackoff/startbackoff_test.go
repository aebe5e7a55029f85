package startbackoff

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	for _, tc := range []struct {
		failures int
		want     time.Duration
	}{
		{-1, 0},
		{0, 0},
		{1, 0}, // the first failure: only the unit's RestartSec
		{2, 5 * time.Second},
		{3, 10 * time.Second},
		{4, 20 * time.Second},
		{5, 40 * time.Second},
		{6, 80 * time.Second},
		{7, 160 * time.Second},
		{8, 5 * time.Minute}, // 320 s capped
		{9, 5 * time.Minute},
		{1 << 20, 5 * time.Minute},
	} {
		if got := Delay(tc.failures); got != tc.want {
			t.Errorf("Delay(%d) = %s, want %s", tc.failures, got, tc.want)
		}
	}
}

func TestPath(t *testing.T) {
	for _, tc := range []struct{ env, want string }{
		{"", "/run/mqlet/start-failures"},
		{"/run/mqlet-x", "/run/mqlet-x/start-failures"},
		{"/run/a:/run/b", "/run/a/start-failures"},
	} {
		got := Path(func(k string) string {
			if k == "RUNTIME_DIRECTORY" {
				return tc.env
			}
			return ""
		})
		if got != tc.want {
			t.Errorf("Path with RUNTIME_DIRECTORY=%q = %q, want %q", tc.env, got, tc.want)
		}
	}
}

func TestCounter(t *testing.T) {
	c := Counter{Path: filepath.Join(t.TempDir(), "mqlet", FileName)}
	for want := 1; want <= 3; want++ {
		if n, err := c.Failed(); n != want || err != nil {
			t.Fatalf("Failed() = %d, %v, want %d", n, err, want)
		}
	}
	if b, _ := os.ReadFile(c.Path); string(b) != "3\n" {
		t.Errorf("file holds %q, want \"3\\n\"", b)
	}
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	if err := c.Reset(); err != nil {
		t.Errorf("Reset with no file: %v", err)
	}
	if n, err := c.Failed(); n != 1 || err != nil {
		t.Errorf("Failed() after Reset = %d, %v, want 1", n, err)
	}

	// Garbage counts from 0, with a warning, and is replaced.
	os.WriteFile(c.Path, []byte("lots\n"), 0o644)
	if n, err := c.Failed(); n != 1 || err == nil {
		t.Errorf("Failed() over garbage = %d, %v, want 1 and an error", n, err)
	}
	if n, err := c.Failed(); n != 2 || err != nil {
		t.Errorf("Failed() after garbage = %d, %v, want 2", n, err)
	}
}

// A counter that cannot be written still counts this failure (the caller waits by it) and says why.
func TestCounterUnwritable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "not-a-dir")
	os.WriteFile(file, nil, 0o644)
	c := Counter{Path: filepath.Join(file, FileName)}
	n, err := c.Failed()
	if n != 1 || err == nil {
		t.Errorf("Failed() under a file = %d, %v, want 1 and an error", n, err)
	}
}
