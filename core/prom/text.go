package prom

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// ContentType is the text exposition format's media type, version 0.0.4.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// sample is one child's value at a scrape: a counter's or gauge's value, or a histogram's sum with
// its per-bucket counts (not cumulative; the last bucket is +Inf).
type sample struct {
	values  []string // label values
	value   float64
	buckets []uint64
}

// WriteText writes every family that has samples, in the text format 0.0.4: families sorted by
// name, each with its HELP and TYPE lines, and its samples sorted by label values. Function-backed
// families are collected now. It fails, writing nothing, when a collector emitted the wrong number
// of label values or the same labels twice (Prometheus would refuse the whole scrape).
func (r *Registry) WriteText(w io.Writer) error {
	r.mu.Lock()
	fams := make([]*family, 0, len(r.families))
	for _, f := range r.families {
		fams = append(fams, f)
	}
	r.mu.Unlock()
	slices.SortFunc(fams, func(a, b *family) int { return strings.Compare(a.name, b.name) })

	var buf bytes.Buffer
	bw := bufio.NewWriter(&buf)
	for _, f := range fams {
		samples, err := f.gather()
		if err != nil {
			return err
		}
		if len(samples) == 0 {
			continue
		}
		writeFamily(bw, f, samples)
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// gather takes the family's samples now, sorted by label values.
func (f *family) gather() ([]sample, error) {
	var out []sample
	if f.collect != nil {
		var bad error
		f.collect(func(v float64, values ...string) {
			if len(values) != len(f.labels) && bad == nil {
				bad = fmt.Errorf("metrics: %s: collector emitted %d label values for labels %v", f.name, len(values), f.labels)
			}
			out = append(out, sample{values: slices.Clone(values), value: v})
		})
		if bad != nil {
			return nil, bad
		}
	} else {
		f.mu.Lock()
		children := make([]*child, 0, len(f.children))
		for _, c := range f.children {
			children = append(children, c)
		}
		f.mu.Unlock()
		for _, c := range children {
			s := c.m.snapshot()
			s.values = c.values
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b sample) int { return slices.Compare(a.values, b.values) })
	for i := 1; i < len(out); i++ {
		if slices.Equal(out[i].values, out[i-1].values) {
			return nil, fmt.Errorf("metrics: %s: two samples with labels %v", f.name, out[i].values)
		}
	}
	return out, nil
}

func writeFamily(w *bufio.Writer, f *family, samples []sample) {
	w.WriteString("# HELP ")
	w.WriteString(f.name)
	w.WriteByte(' ')
	w.WriteString(escapeHelp(f.help))
	w.WriteString("\n# TYPE ")
	w.WriteString(f.name)
	w.WriteByte(' ')
	w.WriteString(string(f.typ))
	w.WriteByte('\n')
	for _, s := range samples {
		if f.typ != HistogramType {
			writeSample(w, f.name, f.labels, s.values, "", "", s.value)
			continue
		}
		var cum uint64
		for i, n := range s.buckets {
			cum += n
			le := "+Inf"
			if i < len(f.buckets) {
				le = formatFloat(f.buckets[i])
			}
			writeSample(w, f.name+"_bucket", f.labels, s.values, "le", le, float64(cum))
		}
		writeSample(w, f.name+"_sum", f.labels, s.values, "", "", s.value)
		writeSample(w, f.name+"_count", f.labels, s.values, "", "", float64(cum))
	}
}

// writeSample writes `name{l1="v1",...,extra="extraValue"} value`; braces only when there are labels.
func writeSample(w *bufio.Writer, name string, labels, values []string, extra, extraValue string, v float64) {
	w.WriteString(name)
	if len(labels) > 0 || extra != "" {
		w.WriteByte('{')
		for i, l := range labels {
			if i > 0 {
				w.WriteByte(',')
			}
			w.WriteString(l)
			w.WriteString(`="`)
			w.WriteString(escapeLabel(values[i]))
			w.WriteByte('"')
		}
		if extra != "" {
			if len(labels) > 0 {
				w.WriteByte(',')
			}
			w.WriteString(extra)
			w.WriteString(`="`)
			w.WriteString(extraValue)
			w.WriteByte('"')
		}
		w.WriteByte('}')
	}
	w.WriteByte(' ')
	w.WriteString(formatFloat(v))
	w.WriteByte('\n')
}

var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

// escapeHelp escapes a HELP text: backslash and line feed.
func escapeHelp(s string) string { return helpEscaper.Replace(strings.ToValidUTF8(s, "\uFFFD")) }

// escapeLabel escapes a label value: backslash, double quote and line feed. The format is UTF-8;
// invalid bytes (a pod name never has them, but a file name might) become U+FFFD.
func escapeLabel(s string) string { return labelEscaper.Replace(strings.ToValidUTF8(s, "\uFFFD")) }

// formatFloat writes a value as Prometheus parses it: +Inf, -Inf, NaN, whole numbers without an
// exponent (byte counts read better as 25165824 than 2.5165824e+07), the rest in Go's shortest form.
func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	case v == math.Trunc(v) && math.Abs(v) < 1<<53:
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// Handler serves the registry in the text format: GET and HEAD only. A collector error is a 500
// with the reason (a programming error: it names the metric).
func (r *Registry) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method "+req.Method+" not allowed on "+req.URL.Path, http.StatusMethodNotAllowed)
			return
		}
		var buf bytes.Buffer
		if err := r.WriteText(&buf); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", ContentType)
		w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
		if req.Method == http.MethodHead {
			return
		}
		w.Write(buf.Bytes())
	})
}
