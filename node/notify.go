package node

import (
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/internal/sdnotify"
)

// serviceNotify is the agent's side of a Type=notify unit (configs/mqlet.service): READY=1 once the
// stored pods are restored and the local API answers, WATCHDOG=1 from the agent's main loop at half
// the unit's WatchdogSec (agent.Options.Heartbeat), STOPPING=1 on the way out. Without
// $NOTIFY_SOCKET (run by hand, another service manager) it does nothing.
type serviceNotify struct {
	n        *sdnotify.Notifier
	watchdog time.Duration // 0: no watchdog asked for
	log      *slog.Logger
	cfg      config.Config
	onReady  func() // Deps.Ready; nil for none

	mu      sync.Mutex
	pending int // parts not ready yet: the agent's restore, the API socket
	failed  bool
}

// newServiceNotify reads systemd's variables and removes them from the environment: they are for
// this process, not for anything it starts.
func newServiceNotify(cfg config.Config, log *slog.Logger, onReady func()) *serviceNotify {
	n, err := sdnotify.New(os.Getenv)
	if err != nil {
		log.Warn("not telling systemd our state", "err", err)
	}
	wd, err := sdnotify.Watchdog(os.Getenv, os.Getpid())
	if err != nil {
		log.Warn("ignoring systemd's watchdog setting", "err", err)
	}
	for _, k := range sdnotify.Env {
		os.Unsetenv(k)
	}
	if n == nil {
		wd = 0
	}
	return &serviceNotify{n: n, watchdog: wd, log: log, cfg: cfg, onReady: onReady, pending: 2}
}

// partReady is called by each part READY waits for; the last one sends it.
func (s *serviceNotify) partReady() {
	s.mu.Lock()
	s.pending--
	last := s.pending == 0
	s.mu.Unlock()
	if last {
		s.send(fmt.Sprintf("READY=1\nSTATUS=running: pods restored, API on %s", s.cfg.APISocket))
		if s.n != nil {
			s.log.Info("told systemd the agent is ready", "watchdog", s.watchdog)
		}
		if s.onReady != nil {
			s.onReady()
		}
	}
}

// heartbeat is agent.Options.Heartbeat: the main loop went round.
func (s *serviceNotify) heartbeat() { s.send("WATCHDOG=1") }

// stopping tells systemd the agent is on its way out (pods keep running).
func (s *serviceNotify) stopping() { s.send("STOPPING=1\nSTATUS=stopping; pods keep running") }

func (s *serviceNotify) send(state string) {
	if err := s.n.Notify(state); err != nil {
		s.mu.Lock()
		first := !s.failed
		s.failed = true
		s.mu.Unlock()
		if first { // once: a watchdog every few seconds must not flood the log
			s.log.Warn("cannot notify systemd", "err", err)
		}
	}
}
