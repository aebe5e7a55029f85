// Package prom is a Prometheus exposition, shared by the agent and mqlet-bridge: a small registry of
// counters, gauges and histograms with labels, figures read at scrape time from functions, a writer
// of the text format 0.0.4 that Prometheus, VictoriaMetrics and every agent that scrapes it read,
// the process's own figures, and the TCP endpoint that serves them. Which figures a binary exports
// is its own business (agent/metrics for the agent).
//
// It is written here rather than taken from prometheus/client_golang because that library costs the
// static binary more than the whole of this package does (see BENCHMARKS.md), and the format is
// small. There is no global state: each binary makes its own Registry.
//
// Names are checked when a metric is registered, and a bad or duplicate name panics: names are
// constants in the code, so that is a programming error a test finds, never something a user sees.
package prom

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Type is a metric family's type as the text format's TYPE line spells it.
type Type string

const (
	CounterType   Type = "counter"
	GaugeType     Type = "gauge"
	HistogramType Type = "histogram"
)

var (
	metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	labelName  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
)

// Registry holds metric families; WriteText and Handler expose them.
type Registry struct {
	mu       sync.Mutex
	families map[string]*family
	reserved map[string]string // names a histogram's series take (x_bucket, x_sum, x_count) -> x
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{families: map[string]*family{}, reserved: map[string]string{}}
}

// family is one metric name with its help, type, label names and either children (values kept
// here) or collect (values read at scrape time).
type family struct {
	name, help string
	typ        Type
	labels     []string
	buckets    []float64 // histograms: upper bounds, ascending, without +Inf

	mu       sync.Mutex
	children map[string]*child // key: label values joined by sep

	collect func(Emit)
}

// sep joins label values into a child's key; it cannot occur in a valid UTF-8 label value.
const sep = "\xff"

type child struct {
	values []string
	m      valuer
}

// valuer is a metric that keeps its own value: *Counter, *Gauge or *Histogram.
type valuer interface{ snapshot() sample }

// Emit reports one sample of a function-backed family at scrape time: its value and its label
// values, in the order of the family's label names.
type Emit func(value float64, labelValues ...string)

// register adds a family, panicking on a bad or duplicate name (a programming error).
func (r *Registry) register(f *family) *family {
	if !metricName.MatchString(f.name) {
		panic(fmt.Sprintf("metrics: invalid metric name %q", f.name))
	}
	seen := map[string]bool{}
	for _, l := range f.labels {
		switch {
		case !labelName.MatchString(l) || strings.HasPrefix(l, "__"):
			panic(fmt.Sprintf("metrics: %s: invalid label name %q", f.name, l))
		case seen[l]:
			panic(fmt.Sprintf("metrics: %s: label %q given twice", f.name, l))
		case l == "le" && f.typ == HistogramType:
			panic(fmt.Sprintf("metrics: %s: a histogram cannot have a label named le", f.name))
		}
		seen[l] = true
	}
	if f.typ == HistogramType {
		if len(f.buckets) > 0 && math.IsInf(f.buckets[len(f.buckets)-1], 1) {
			f.buckets = f.buckets[:len(f.buckets)-1] // +Inf is always there
		}
		if len(f.buckets) == 0 {
			panic(fmt.Sprintf("metrics: %s: a histogram needs at least one bucket", f.name))
		}
		for i, b := range f.buckets {
			if math.IsNaN(b) || i > 0 && b <= f.buckets[i-1] {
				panic(fmt.Sprintf("metrics: %s: buckets must increase strictly: %v", f.name, f.buckets))
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	taken := func(n string) bool {
		_, fam := r.families[n]
		_, res := r.reserved[n]
		return fam || res
	}
	if taken(f.name) {
		panic(fmt.Sprintf("metrics: %s registered twice", f.name))
	}
	if f.typ == HistogramType {
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			if taken(f.name + s) {
				panic(fmt.Sprintf("metrics: histogram %s clashes with %s", f.name, f.name+s))
			}
		}
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			r.reserved[f.name+s] = f.name
		}
	}
	f.children = map[string]*child{}
	r.families[f.name] = f
	return f
}

// with returns the child for values, making it with mk on first use.
func (f *family) with(values []string, mk func() valuer) valuer {
	if len(values) != len(f.labels) {
		panic(fmt.Sprintf("metrics: %s: %d label values for labels %v", f.name, len(values), f.labels))
	}
	key := strings.Join(values, sep)
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.children[key]
	if !ok {
		c = &child{values: slices.Clone(values), m: mk()}
		f.children[key] = c
	}
	return c.m
}

// Counter is a value that only goes up (events, seconds spent). Safe for concurrent use.
type Counter struct{ bits atomic.Uint64 }

// Inc adds 1.
func (c *Counter) Inc() { c.Add(1) }

// Add adds v, which must not be negative: a counter that goes down reads as a reset.
func (c *Counter) Add(v float64) {
	if v < 0 || math.IsNaN(v) {
		panic(fmt.Sprintf("metrics: counter cannot add %v", v))
	}
	addFloat(&c.bits, v)
}

// Value is the current count.
func (c *Counter) Value() float64 { return math.Float64frombits(c.bits.Load()) }

func (c *Counter) snapshot() sample { return sample{value: c.Value()} }

// Gauge is a value that goes up and down. Safe for concurrent use.
type Gauge struct{ bits atomic.Uint64 }

// Set sets the value.
func (g *Gauge) Set(v float64) { g.bits.Store(math.Float64bits(v)) }

// Add adds v (negative to subtract).
func (g *Gauge) Add(v float64) { addFloat(&g.bits, v) }

// Value is the current value.
func (g *Gauge) Value() float64 { return math.Float64frombits(g.bits.Load()) }

func (g *Gauge) snapshot() sample { return sample{value: g.Value()} }

func addFloat(bits *atomic.Uint64, v float64) {
	for {
		old := bits.Load()
		if bits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

// Histogram counts observations in buckets of upper bounds. Observations are rare in the agent (a
// pod sync, a store write), so a mutex keeps every scrape's buckets, sum and count consistent.
type Histogram struct {
	upper []float64 // shared with the family; never written after registration

	mu     sync.Mutex
	counts []uint64 // per bucket, not cumulative; the last is +Inf
	sum    float64
}

func newHistogram(upper []float64) *Histogram {
	return &Histogram{upper: upper, counts: make([]uint64, len(upper)+1)}
}

// Observe records v (for durations: seconds).
func (h *Histogram) Observe(v float64) {
	i, _ := slices.BinarySearch(h.upper, v) // first bound >= v: buckets are "less than or equal"
	h.mu.Lock()
	h.counts[i]++
	h.sum += v
	h.mu.Unlock()
}

func (h *Histogram) snapshot() sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	return sample{value: h.sum, buckets: slices.Clone(h.counts)}
}

// Counter registers a counter without labels.
func (r *Registry) Counter(name, help string) *Counter {
	return r.CounterVec(name, help).With()
}

// CounterVec is a counter family with labels.
type CounterVec struct{ f *family }

// CounterVec registers a counter family with the given label names.
func (r *Registry) CounterVec(name, help string, labels ...string) *CounterVec {
	return &CounterVec{r.register(&family{name: name, help: help, typ: CounterType, labels: labels})}
}

// With returns the counter for these label values (one per label name, in order), made at 0 on
// first use. Callers on a hot path keep the result.
func (v *CounterVec) With(values ...string) *Counter {
	return v.f.with(values, func() valuer { return &Counter{} }).(*Counter)
}

// Gauge registers a gauge without labels.
func (r *Registry) Gauge(name, help string) *Gauge { return r.GaugeVec(name, help).With() }

// GaugeVec is a gauge family with labels.
type GaugeVec struct{ f *family }

// GaugeVec registers a gauge family with the given label names.
func (r *Registry) GaugeVec(name, help string, labels ...string) *GaugeVec {
	return &GaugeVec{r.register(&family{name: name, help: help, typ: GaugeType, labels: labels})}
}

// With returns the gauge for these label values, made at 0 on first use.
func (v *GaugeVec) With(values ...string) *Gauge {
	return v.f.with(values, func() valuer { return &Gauge{} }).(*Gauge)
}

// Histogram registers a histogram without labels; buckets are the upper bounds, ascending (+Inf is
// added).
func (r *Registry) Histogram(name, help string, buckets []float64) *Histogram {
	return r.HistogramVec(name, help, buckets).With()
}

// HistogramVec is a histogram family with labels.
type HistogramVec struct{ f *family }

// HistogramVec registers a histogram family with the given buckets and label names.
func (r *Registry) HistogramVec(name, help string, buckets []float64, labels ...string) *HistogramVec {
	f := r.register(&family{name: name, help: help, typ: HistogramType, labels: labels, buckets: slices.Clone(buckets)})
	return &HistogramVec{f}
}

// With returns the histogram for these label values, empty on first use.
func (v *HistogramVec) With(values ...string) *Histogram {
	return v.f.with(values, func() valuer { return newHistogram(v.f.buckets) }).(*Histogram)
}

// Func registers a counter or gauge family whose samples collect reports at every scrape, so a
// figure the agent already knows (pods by phase, the outbox's depth, the process's memory) costs
// nothing between scrapes and needs no hook in a hot path. collect is called without any lock of
// the registry held and may emit nothing (the family is then left out).
func (r *Registry) Func(name, help string, typ Type, labels []string, collect func(Emit)) {
	if typ != CounterType && typ != GaugeType {
		panic(fmt.Sprintf("metrics: %s: a function-backed family is a counter or a gauge, not %q", name, typ))
	}
	r.register(&family{name: name, help: help, typ: typ, labels: slices.Clone(labels), collect: collect})
}
