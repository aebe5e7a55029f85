package api

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// logProvider serves one log file for every container.
type logProvider struct {
	fakeProvider
	path string
}

func (l *logProvider) LogPath(namespace, name, container string, previous bool) (string, error) {
	if name != "web" {
		return "", errors.New("pod " + namespace + "/" + name + " not found")
	}
	return l.path, nil
}

func TestLogsDecodesCRIWithOptions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	old := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339Nano)
	recent := time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano)
	os.WriteFile(path, []byte(old+" stdout F first\n"+recent+" stdout P sec\n"+recent+" stdout F ond\n"+recent+" stderr F third\n"), 0o640)
	c := NewClient(startServer(t, &logProvider{path: path}))
	one, zero := int64(1), int64(0)
	for _, tc := range []struct {
		name string
		o    LogOptions
		want string
	}{
		{"whole", LogOptions{}, "first\nsecond\nthird\n"},
		{"tail", LogOptions{TailLines: &one}, "third\n"},
		{"tail 0", LogOptions{TailLines: &zero}, ""},
		{"since", LogOptions{Since: 10 * time.Minute}, "second\nthird\n"},
		{"timestamps", LogOptions{TailLines: &one, Timestamps: true}, recent + " third\n"},
	} {
		var b bytes.Buffer
		if err := c.Logs(context.Background(), "default", "web", tc.o, &b); err != nil || b.String() != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.name, b.String(), err, tc.want)
		}
	}
	var b bytes.Buffer
	if err := c.Logs(context.Background(), "default", "nope", LogOptions{}, &b); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("missing pod: %v", err)
	}
}

func TestLogReadOptionsRefusesBadParameters(t *testing.T) {
	for q, want := range map[string]string{
		"tailLines=-2":                         "tailLines",
		"tailLines=ten":                        "tailLines",
		"sinceSeconds=0":                       "sinceSeconds",
		"sinceTime=yesterday":                  "sinceTime",
		"sinceSeconds=5&sinceTime=2026-01-01Z": "at most one",
	} {
		c := NewClient(startServer(t, &logProvider{path: "/nonexistent"}))
		resp, err := c.getWith(c.hc, context.Background(), "/api/v1/namespaces/default/pods/web/log?"+q)
		if err != nil {
			t.Fatal(err)
		}
		body := make([]byte, 512)
		n, _ := resp.Body.Read(body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(body[:n]), want) {
			t.Errorf("%s: %d %s, want 400 naming %q", q, resp.StatusCode, body[:n], want)
		}
	}
}

// A followed log ends when its container restarts: the log path moves to the next attempt's file.
func TestFollowEndsWhenTheLogMoves(t *testing.T) {
	dir := t.TempDir()
	first := filepath.Join(dir, "0.log")
	os.WriteFile(first, []byte(time.Now().UTC().Format(time.RFC3339Nano)+" stdout F one\n"), 0o640)
	p := &movingLogs{path: first}
	c := NewClient(startServer(t, p))
	done := make(chan string, 1)
	go func() {
		var b bytes.Buffer
		c.Logs(context.Background(), "default", "web", LogOptions{Follow: true}, &b)
		done <- b.String()
	}()
	time.Sleep(300 * time.Millisecond)
	p.move(filepath.Join(dir, "1.log"))
	select {
	case out := <-done:
		if out != "one\n" {
			t.Errorf("followed log = %q", out)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the follow did not end after the log moved")
	}
}

type movingLogs struct {
	fakeProvider
	mu   sync.Mutex
	path string
}

func (m *movingLogs) LogPath(namespace, name, container string, previous bool) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.path, nil
}

func (m *movingLogs) move(p string) {
	m.mu.Lock()
	m.path = p
	m.mu.Unlock()
}
