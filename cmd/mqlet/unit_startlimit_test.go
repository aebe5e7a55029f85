package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The shipped unit can never be parked by systemd's start limit: an A/B rollback, a bad config or
// a full disk make the agent fail at start, and an unattended device must keep retrying (every
// RestartSec) until it is fixed, not sit "failed" until someone logs in. StartLimitIntervalSec=0
// in [Unit] turns the limit off; Restart= must restart on failure.
func TestUnitHasNoStartLimit(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "configs", "mqlet.service"))
	if err != nil {
		t.Fatal(err)
	}
	section, keys := "", map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "[") {
			section = line
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			keys[section+k] = v
		}
	}
	if v := keys["[Unit]StartLimitIntervalSec"]; v != "0" {
		t.Errorf("[Unit] StartLimitIntervalSec = %q, want 0 (no start limit)", v)
	}
	if v := keys["[Service]StartLimitIntervalSec"]; v != "" {
		t.Errorf("[Service] StartLimitIntervalSec = %q: systemd reads it only in [Unit]", v)
	}
	if v := keys["[Service]Restart"]; v != "always" && v != "on-failure" {
		t.Errorf("[Service] Restart = %q, want always or on-failure", v)
	}
	// Forever, but backing off: a node that cannot start must not spin every 5 s for days.
	if keys["[Service]RestartSteps"] == "" || keys["[Service]RestartMaxDelaySec"] == "" {
		t.Errorf("[Service] RestartSteps = %q, RestartMaxDelaySec = %q: want a back-off between restarts",
			keys["[Service]RestartSteps"], keys["[Service]RestartMaxDelaySec"])
	}
}
