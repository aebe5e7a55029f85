package prom

import (
	"bytes"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// parseText parses the text format as Prometheus does (legacy name rules: the strict ones).
func parseText(t *testing.T, text string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("not valid Prometheus text: %v\n%s", err, text)
	}
	return fams
}

func writeText(t *testing.T, r *Registry) string {
	t.Helper()
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// The whole output of a small registry, byte for byte: families sorted by name whatever the order
// of registration, samples sorted by label values whatever the order of first use, HELP and label
// values escaped, histogram buckets cumulative with +Inf, _sum and _count, values formatted.
func TestWriteTextExact(t *testing.T) {
	r := NewRegistry()
	h := r.HistogramVec("zz_latency_seconds", "Latency.", []float64{0.1, 0.5, 1}, "op")
	c := r.CounterVec("aa_events_total", "Events with a \\ backslash\nand a line feed.", "type", "reason")
	g := r.Gauge("mm_temperature_celsius", "Temperature.")
	r.Func("mm_pods", "Pods by phase.", GaugeType, []string{"phase"}, func(emit Emit) {
		emit(3, "Running")
		emit(0, "Failed")
	})
	r.CounterVec("bb_unused_total", "Never used: left out.", "x")

	c.With("Warning", `say "hi"`+"\n"+`C:\dir`).Add(2)
	c.With("Normal", "Started").Inc()
	c.With("Normal", "Pulled").Add(1.5)
	g.Set(-41.25)
	h.With("write").Observe(0.1) // on a bound: counted in that bucket
	h.With("write").Observe(0.7)
	h.With("write").Observe(5)
	h.With("read").Observe(0.05)

	want := `# HELP aa_events_total Events with a \\ backslash\nand a line feed.
# TYPE aa_events_total counter
aa_events_total{type="Normal",reason="Pulled"} 1.5
aa_events_total{type="Normal",reason="Started"} 1
aa_events_total{type="Warning",reason="say \"hi\"\nC:\\dir"} 2
# HELP mm_pods Pods by phase.
# TYPE mm_pods gauge
mm_pods{phase="Failed"} 0
mm_pods{phase="Running"} 3
# HELP mm_temperature_celsius Temperature.
# TYPE mm_temperature_celsius gauge
mm_temperature_celsius -41.25
# HELP zz_latency_seconds Latency.
# TYPE zz_latency_seconds histogram
zz_latency_seconds_bucket{op="read",le="0.1"} 1
zz_latency_seconds_bucket{op="read",le="0.5"} 1
zz_latency_seconds_bucket{op="read",le="1"} 1
zz_latency_seconds_bucket{op="read",le="+Inf"} 1
zz_latency_seconds_sum{op="read"} 0.05
zz_latency_seconds_count{op="read"} 1
zz_latency_seconds_bucket{op="write",le="0.1"} 1
zz_latency_seconds_bucket{op="write",le="0.5"} 1
zz_latency_seconds_bucket{op="write",le="1"} 2
zz_latency_seconds_bucket{op="write",le="+Inf"} 3
zz_latency_seconds_sum{op="write"} 5.8
zz_latency_seconds_count{op="write"} 3
`
	got := writeText(t, r)
	if got != want {
		t.Errorf("output differs.\ngot:\n%s\nwant:\n%s", got, want)
	}
	// And Prometheus reads back what was meant, escapes undone.
	fams := parseText(t, got)
	if len(fams) != 4 {
		t.Errorf("parsed %d families, want 4 (the unused counter left out)", len(fams))
	}
	if help := fams["aa_events_total"].GetHelp(); help != "Events with a \\ backslash\nand a line feed." {
		t.Errorf("help read back as %q", help)
	}
	var found bool
	for _, m := range fams["aa_events_total"].Metric {
		for _, l := range m.Label {
			if l.GetName() == "reason" && l.GetValue() == `say "hi"`+"\n"+`C:\dir` {
				found = m.GetCounter().GetValue() == 2
			}
		}
	}
	if !found {
		t.Errorf("escaped label value not read back with its count: %v", fams["aa_events_total"])
	}
	hist := fams["zz_latency_seconds"].Metric[1].GetHistogram() // op=write
	if hist.GetSampleCount() != 3 || math.Abs(hist.GetSampleSum()-5.8) > 1e-9 || hist.Bucket[2].GetCumulativeCount() != 2 {
		t.Errorf("histogram read back as %v", hist)
	}
}

func TestFormatFloat(t *testing.T) {
	for _, c := range []struct {
		in   float64
		want string
	}{
		{0, "0"}, {1, "1"}, {-3, "-3"}, {25165824, "25165824"}, {0.005, "0.005"}, {1.5e-7, "1.5e-07"},
		{1e300, "1e+300"}, {math.Inf(1), "+Inf"}, {math.Inf(-1), "-Inf"}, {math.NaN(), "NaN"},
		{math.Copysign(0, -1), "0"},
	} {
		if got := formatFloat(c.in); got != c.want {
			t.Errorf("formatFloat(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestEscapeInvalidUTF8(t *testing.T) {
	r := NewRegistry()
	r.GaugeVec("g", "h", "file").With("a\xffb").Set(1)
	got := writeText(t, r)
	if !strings.Contains(got, "g{file=\"a\uFFFDb\"} 1\n") {
		t.Errorf("invalid UTF-8 not replaced:\n%s", got)
	}
	parseText(t, got)
}

func TestHistogramBuckets(t *testing.T) {
	r := NewRegistry()
	h := r.Histogram("h_seconds", "h", []float64{1, 2, 4, math.Inf(1)}) // a trailing +Inf is dropped, not doubled
	for _, v := range []float64{0, 1, 1.5, 2, 3, 4, 100} {
		h.Observe(v)
	}
	fams := parseText(t, writeText(t, r))
	got := fams["h_seconds"].Metric[0].GetHistogram()
	wantCum := []uint64{2, 4, 6} // <=1: 0,1; <=2: +1.5,2; <=4: +3,4
	if len(got.Bucket) != 3 && len(got.Bucket) != 4 {
		t.Fatalf("buckets: %v", got.Bucket)
	}
	for i, w := range wantCum {
		if got.Bucket[i].GetCumulativeCount() != w {
			t.Errorf("bucket le=%v: %d, want %d", got.Bucket[i].GetUpperBound(), got.Bucket[i].GetCumulativeCount(), w)
		}
	}
	if got.GetSampleCount() != 7 || got.GetSampleSum() != 111.5 {
		t.Errorf("count %d sum %v, want 7 and 111.5", got.GetSampleCount(), got.GetSampleSum())
	}
	if n := strings.Count(writeText(t, r), `le="+Inf"`); n != 1 {
		t.Errorf("%d +Inf buckets, want 1", n)
	}
}

func TestCounterAndGauge(t *testing.T) {
	r := NewRegistry()
	c := r.Counter("c_total", "c")
	c.Inc()
	c.Add(2.5)
	g := r.Gauge("g", "g")
	g.Set(10)
	g.Add(-4)
	if c.Value() != 3.5 || g.Value() != 6 {
		t.Errorf("counter %v gauge %v, want 3.5 and 6", c.Value(), g.Value())
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("a counter took a negative add")
			}
		}()
		c.Add(-1)
	}()
}

func TestRegisterRefusesBadNames(t *testing.T) {
	for name, reg := range map[string]func(r *Registry){
		"bad metric name":    func(r *Registry) { r.Counter("1abc", "h") },
		"dash in name":       func(r *Registry) { r.Gauge("a-b", "h") },
		"bad label name":     func(r *Registry) { r.GaugeVec("g", "h", "a-b") },
		"reserved label":     func(r *Registry) { r.GaugeVec("g", "h", "__name") },
		"label twice":        func(r *Registry) { r.GaugeVec("g", "h", "a", "a") },
		"le in histogram":    func(r *Registry) { r.HistogramVec("h", "h", []float64{1}, "le") },
		"no buckets":         func(r *Registry) { r.Histogram("h", "h", nil) },
		"buckets not rising": func(r *Registry) { r.Histogram("h", "h", []float64{1, 1}) },
		"duplicate":          func(r *Registry) { r.Gauge("g", "h"); r.Counter("g", "h") },
		"histogram suffix":   func(r *Registry) { r.Histogram("h", "h", []float64{1}); r.Gauge("h_count", "h") },
		"suffix then histo":  func(r *Registry) { r.Gauge("h_sum", "h"); r.Histogram("h", "h", []float64{1}) },
		"func of histogram":  func(r *Registry) { r.Func("f", "h", HistogramType, nil, func(Emit) {}) },
		"wrong value count":  func(r *Registry) { r.GaugeVec("g", "h", "a").With() },
		"too many values":    func(r *Registry) { r.Gauge("g", "h"); r.GaugeVec("g2", "h", "a").With("x", "y") },
		"values on plain gauge": func(r *Registry) {
			r.CounterVec("c", "h").With("x")
		},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			reg(NewRegistry())
		})
	}
}

func TestCollectorMistakesFailTheScrape(t *testing.T) {
	for name, collect := range map[string]func(Emit){
		"wrong label count": func(emit Emit) { emit(1) },
		"duplicate labels":  func(emit Emit) { emit(1, "x"); emit(2, "x") },
	} {
		t.Run(name, func(t *testing.T) {
			r := NewRegistry()
			r.Gauge("a_ok", "fine").Set(1)
			r.Func("f", "h", GaugeType, []string{"k"}, collect)
			var b bytes.Buffer
			if err := r.WriteText(&b); err == nil || !strings.Contains(err.Error(), "f:") {
				t.Errorf("WriteText error = %v, want one naming metric f", err)
			}
			if b.Len() != 0 {
				t.Errorf("a failed scrape wrote %q", b.String())
			}
			rec := httptest.NewRecorder()
			r.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
			if rec.Code != http.StatusInternalServerError {
				t.Errorf("handler answered %d, want 500", rec.Code)
			}
		})
	}
}

func TestHandler(t *testing.T) {
	r := NewRegistry()
	r.Counter("c_total", "c").Inc()
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "text/plain; version=0.0.4; charset=utf-8" {
		t.Errorf("GET: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	if rec.Body.String() != "# HELP c_total c\n# TYPE c_total counter\nc_total 1\n" {
		t.Errorf("body %q", rec.Body.String())
	}
	// The format the response declares is the one Prometheus then picks to parse it.
	if f := expfmt.ResponseFormat(rec.Header()); f.FormatType() != expfmt.TypeTextPlain {
		t.Errorf("content type read as %v", f)
	}
	rec = httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodHead, "/metrics", nil))
	if rec.Code != 200 || rec.Body.Len() != 0 || rec.Header().Get("Content-Length") == "" {
		t.Errorf("HEAD: %d, body %q, length %q", rec.Code, rec.Body.String(), rec.Header().Get("Content-Length"))
	}
	rec = httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/metrics", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", rec.Code)
	}
}
