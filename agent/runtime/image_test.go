package runtime

import (
	"io"
	"strings"
	"testing"
	"time"
)

func TestNormalizeImage(t *testing.T) {
	for in, want := range map[string]string{
		"busybox":                    "docker.io/library/busybox:latest",
		"busybox:1.36":               "docker.io/library/busybox:1.36",
		"127.0.0.1:5000/mqlet/app:1": "127.0.0.1:5000/mqlet/app:1",
		"mqlet.test/busybox:1":       "mqlet.test/busybox:1",
		"ghcr.io/org/app@sha256:" + strings.Repeat("a", 64): "ghcr.io/org/app@sha256:" + strings.Repeat("a", 64),
	} {
		if got, err := NormalizeImage(in); err != nil || got != want {
			t.Errorf("NormalizeImage(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := NormalizeImage("Not A Ref"); err == nil {
		t.Errorf("NormalizeImage of an invalid name: no error")
	}
}

// stallBody passes data through and reports a stall by the URL once its timer fired.
func TestStallBody(t *testing.T) {
	r, w := io.Pipe()
	b := &stallBody{rc: r, url: "https://reg/v2/x/blobs/y"}
	b.timer = timerNever()
	go w.Write([]byte("abc"))
	buf := make([]byte, 8)
	if n, err := b.Read(buf); err != nil || string(buf[:n]) != "abc" {
		t.Fatalf("read = %q, %v", buf[:n], err)
	}
	// What the timer does when nothing arrives in time.
	b.stalled.Store(true)
	r.Close()
	if _, err := b.Read(buf); err == nil || !strings.Contains(err.Error(), "reg/v2/x/blobs/y") {
		t.Errorf("stalled read error = %v, want one naming the URL", err)
	}
	b.Close()
}

func timerNever() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}
