package broker

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]string{
		"tcp://h":          "tcp://h:1883",
		"mqtt://h":         "tcp://h:1883",
		"mqtts://h":        "ssl://h:8883",
		"tls://h:1":        "ssl://h:1",
		"ssl://[::1]":      "ssl://[::1]:8883",
		"ws://h:8080/mqtt": "ws://h:8080/mqtt",
		"wss://h/mqtt":     "wss://h/mqtt",
	} {
		got, err := Parse(in)
		if err != nil || got.Dial != want {
			t.Errorf("Parse(%q) = %q, %v; want %q", in, got.Dial, err, want)
		}
	}
	for in, want := range map[string]string{
		"":                      "empty",
		"h:1883":                "scheme://host:port",
		"http://h:80":           `scheme "http" is not supported`,
		"tcp://:1883":           "names no host",
		"tcp://u:secret@h:1883": "not in the URL",
		"tcp://h:0":             `port "0"`,
		"tcp://h:1883/mqtt":     "ws:// and wss://",
	} {
		if _, err := Parse(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", in, err, want)
		}
	}
}
