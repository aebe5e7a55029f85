package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
)

// series is one scrape of a Prometheus text endpoint: the full series name (with its labels, as
// written) -> value.
type series map[string]float64

func parseSeries(r io.Reader) (series, error) {
	out := series{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue // a timestamp or an exotic value: not needed here
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// name is a series' metric name; label returns one label's value ("" when absent).
func seriesName(s string) string {
	if i := strings.IndexByte(s, '{'); i >= 0 {
		return s[:i]
	}
	return s
}

func label(s, key string) string {
	i := strings.Index(s, key+`="`)
	if i < 0 {
		return ""
	}
	rest := s[i+len(key)+2:]
	j := strings.IndexByte(rest, '"')
	if j < 0 {
		return ""
	}
	return rest[:j]
}

// sum adds every series of metric name whose labels match the given key=value pairs.
func (s series) sum(name string, match ...string) float64 {
	var t float64
next:
	for k, v := range s {
		if seriesName(k) != name {
			continue
		}
		for i := 0; i+1 < len(match); i += 2 {
			if label(k, match[i]) != match[i+1] {
				continue next
			}
		}
		t += v
	}
	return t
}

// minus is s - before, series by series (counters and histogram sums over a window).
func (s series) minus(before series) series {
	out := series{}
	for k, v := range s {
		out[k] = v - before[k]
	}
	return out
}

// scrapeBridge reads the bridge's /metrics and saves it to file when file is not "".
func scrapeBridge(ctx context.Context, addr, file string) (series, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("bridge /metrics: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("bridge /metrics: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("bridge /metrics: %s", resp.Status)
	}
	return saveAndParse(body, file)
}

// scrapeAPIServer reads kube-apiserver's own /metrics as the admin.
func scrapeAPIServer(ctx context.Context, cs kubernetes.Interface, file string) (series, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver /metrics: %w", err)
	}
	return saveAndParse(body, file)
}

func saveAndParse(body []byte, file string) (series, error) {
	if file != "" {
		if err := os.WriteFile(file, body, 0o644); err != nil {
			return nil, err
		}
	}
	return parseSeries(strings.NewReader(string(body)))
}

// requestCost is the apiserver's time spent on one verb and resource in a window.
type requestCost struct {
	verb, resource, subresource string
	count, seconds              float64
}

// apiserverCosts lists, from a window's delta of apiserver_request_duration_seconds, the verbs
// and resources by total time, largest first.
func apiserverCosts(d series) []requestCost {
	m := map[string]*requestCost{}
	for k, v := range d {
		n := seriesName(k)
		if n != "apiserver_request_duration_seconds_sum" && n != "apiserver_request_duration_seconds_count" {
			continue
		}
		if verb := label(k, "verb"); verb == "WATCH" || verb == "CONNECT" {
			continue // long-running: their duration is how long the watch was open
		}
		key := label(k, "verb") + " " + label(k, "resource") + "/" + label(k, "subresource")
		c := m[key]
		if c == nil {
			c = &requestCost{verb: label(k, "verb"), resource: label(k, "resource"), subresource: label(k, "subresource")}
			m[key] = c
		}
		if strings.HasSuffix(n, "_sum") {
			c.seconds += v
		} else {
			c.count += v
		}
	}
	var out []requestCost
	for _, c := range m {
		if c.count > 0 {
			out = append(out, *c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].seconds > out[j].seconds })
	return out
}

func (c requestCost) String() string {
	r := c.resource
	if c.subresource != "" {
		r += "/" + c.subresource
	}
	return fmt.Sprintf("%s %s: %.0f requests, mean %.1f ms", c.verb, r, c.count, 1000*c.seconds/c.count)
}

// bridgeWrites lists the bridge's API write latencies in a window (bridge_api_write_seconds by op).
func bridgeWrites(d series) []string {
	var out []string
	for k, v := range d {
		if seriesName(k) != "bridge_api_write_seconds_count" || v == 0 {
			continue
		}
		op := label(k, "op")
		sum := d.sum("bridge_api_write_seconds_sum", "op", op)
		out = append(out, fmt.Sprintf("%s: %.0f, mean %.1f ms", op, v, 1000*sum/v))
	}
	sort.Strings(out)
	return out
}
