package prom

import (
	"os"
	"path/filepath"
	"testing"
)

// A fixture /proc: a command name with spaces and a parenthesis (the parser counts fields from the
// last ')'), 1234+566 ticks of CPU, 5000 resident pages, started 3000 ticks after a boot at
// 1700000000, three open descriptors.
func fixtureProc(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	self := filepath.Join(root, "self")
	os.MkdirAll(filepath.Join(self, "fd"), 0o755)
	stat := "4242 (my (odd) cmd) S 1 4242 4242 0 -1 4194560 1000 0 0 0 1234 566 0 0 20 0 12 0 3000 800000000 5000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
	files := map[string]string{
		"self/stat":  stat,
		"self/statm": "195312 5000 2000 1000 0 30000 0\n",
		"stat":       "cpu  1 2 3 4\nintr 1 2\nbtime 1700000000\nprocesses 42\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, fd := range []string{"0", "1", "2"} {
		os.WriteFile(filepath.Join(self, "fd", fd), nil, 0o644)
	}
	return root
}

func TestProcessFigures(t *testing.T) {
	r := NewRegistry()
	RegisterProcess(r, fixtureProc(t))
	fams := parseText(t, writeText(t, r))
	page := float64(os.Getpagesize())
	for name, want := range map[string]float64{
		"process_cpu_seconds_total":     18.0, // (1234+566)/100
		"process_resident_memory_bytes": 5000 * page,
		"process_virtual_memory_bytes":  195312 * page,
		"process_start_time_seconds":    1700000030,
		"process_open_fds":              3,
	} {
		f := fams[name]
		if f == nil || len(f.Metric) != 1 {
			t.Errorf("%s missing: %v", name, f)
			continue
		}
		got := f.Metric[0].GetGauge().GetValue() + f.Metric[0].GetCounter().GetValue()
		if got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if g := fams["go_goroutines"]; g == nil || g.Metric[0].GetGauge().GetValue() < 1 {
		t.Errorf("go_goroutines: %v", g)
	}
	if h := fams["go_memstats_heap_alloc_bytes"]; h == nil || h.Metric[0].GetGauge().GetValue() <= 0 {
		t.Errorf("go_memstats_heap_alloc_bytes: %v", h)
	}
}

// Without /proc (another OS, a locked-down container) the process figures are left out and the
// scrape still works.
func TestProcessFiguresDegrade(t *testing.T) {
	r := NewRegistry()
	RegisterProcess(r, filepath.Join(t.TempDir(), "absent"))
	fams := parseText(t, writeText(t, r))
	for name := range fams {
		if len(name) > 8 && name[:8] == "process_" {
			t.Errorf("%s reported without a /proc", name)
		}
	}
	if fams["go_goroutines"] == nil {
		t.Error("go_goroutines missing")
	}
}

func TestProcessFiguresOfThisProcess(t *testing.T) {
	r := NewRegistry()
	RegisterProcess(r, "/proc")
	fams := parseText(t, writeText(t, r))
	if rss := fams["process_resident_memory_bytes"]; rss == nil || rss.Metric[0].GetGauge().GetValue() < 1<<20 {
		t.Errorf("resident memory of the test process: %v", rss)
	}
	if st := fams["process_start_time_seconds"]; st == nil || st.Metric[0].GetGauge().GetValue() < 1.5e9 {
		t.Errorf("start time of the test process: %v", st)
	}
}

func TestReadProcStatRejectsGarbage(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{"noparen": "1 cmd S 1 2 3", "short": "1 (cmd) S 1 2 3"} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), 0o644)
		if _, err := readProcStat(p); err == nil {
			t.Errorf("%s: parsed %q", name, content)
		}
	}
}

// The start time is read once: a later scrape reports it without reading /proc/stat again.
func TestProcessStartTimeKept(t *testing.T) {
	root := fixtureProc(t)
	r := NewRegistry()
	RegisterProcess(r, root)
	parseText(t, writeText(t, r))
	if err := os.Remove(filepath.Join(root, "stat")); err != nil {
		t.Fatal(err)
	}
	f := parseText(t, writeText(t, r))["process_start_time_seconds"]
	if f == nil || f.Metric[0].GetGauge().GetValue() != 1700000030 {
		t.Errorf("process_start_time_seconds after /proc/stat went: %v, want 1700000030", f)
	}
}
