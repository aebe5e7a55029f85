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
	// Forever, backing off: the agent waits after a failed start itself (agent_backoff.go), on
	// systemd 252 too; systemd's own step-up would stack with it and never forgets a crash after
	// a good start.
	if keys["[Service]RestartSec"] == "" {
		t.Errorf("[Service] RestartSec unset: want a fixed pause between restarts, below the agent's own back-off")
	}
	for _, k := range []string{"RestartSteps", "RestartMaxDelaySec"} {
		if v := keys["[Service]"+k]; v != "" {
			t.Errorf("[Service] %s = %q: it would stack with the agent's own start back-off", k, v)
		}
	}
}
