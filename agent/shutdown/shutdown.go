// Package shutdown is mqlet's graceful node shutdown: when the machine is about to go down it
// stops the node's pods within the configured grace period, critical pods last, so that they end
// cleanly instead of being killed by the power going, and their status says why. It follows
// systemd-logind where there is one (a delay inhibitor lock and PrepareForShutdown, as kubelet
// does), and a signal otherwise (init systems and UPS daemons without logind).
package shutdown

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Pods is what a shutdown acts on; *agent.Agent implements it.
type Pods interface {
	// ShutdownPods stops the running pods, the non-critical ones first with otherGrace, then the
	// critical ones with criticalGrace, and returns once they stopped or their grace passed.
	ShutdownPods(ctx context.Context, criticalGrace, otherGrace time.Duration)
	// CancelShutdown says a shutdown was called off: the node admits new pods again.
	CancelShutdown()
}

// Options configure a Manager.
type Options struct {
	// GracePeriod is the whole time pods get (shutdownGracePeriod); 0 turns graceful node
	// shutdown off, as in kubelet: the Manager then does nothing.
	GracePeriod time.Duration
	// CriticalGracePeriod is the part of GracePeriod kept for critical pods
	// (shutdownGracePeriodCriticalPods); the others get the rest.
	CriticalGracePeriod time.Duration
	// Signal also starts a shutdown when the agent receives it (shutdownSignal, SIGPWR by default:
	// what init sends on a power failure); nil: none.
	Signal os.Signal
	// BusAddress is the D-Bus system bus to find logind on; empty: the standard one
	// ($DBUS_SYSTEM_BUS_ADDRESS, else /run/dbus/system_bus_socket).
	BusAddress string
	// LogindConfDir is where a drop-in raising logind's InhibitDelayMaxSec is written when it is
	// shorter than GracePeriod; empty: /etc/systemd/logind.conf.d.
	LogindConfDir string
	Log           *slog.Logger
}

// DefaultLogindConfDir is logind's drop-in directory.
const DefaultLogindConfDir = "/etc/systemd/logind.conf.d"

// LogindDropIn is the name of the drop-in mqlet writes there when logind would not wait for the
// whole grace period; late in the order so that it wins, like kubelet's 99-kubelet.conf. Its
// first line starts with LogindDropInMark, which `mqlet uninstall --purge` looks for.
const LogindDropIn = "99-mqlet.conf"

// LogindDropInMark starts the drop-in mqlet writes.
const LogindDropInMark = "# Written by mqlet"

// Reconnecting to the system bus: quickly at first (logind restarted, or dbus starting after the
// agent at boot), then rarely on a machine that has no bus at all.
const (
	reconnectMin = time.Second
	reconnectMax = time.Minute
)

// Manager watches for a shutdown and stops the pods. Create it with New, then Run.
type Manager struct {
	opts Options
	pods Pods
	log  *slog.Logger
}

// New makes a Manager for pods.
func New(opts Options, pods Pods) *Manager {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.LogindConfDir == "" {
		opts.LogindConfDir = DefaultLogindConfDir
	}
	return &Manager{opts: opts, pods: pods, log: opts.Log.With("component", "node-shutdown")}
}

// Run watches for a shutdown until ctx ends, then releases what it holds (the signal, the
// inhibitor lock, the bus connection); no goroutine of it outlives the call.
func (m *Manager) Run(ctx context.Context) error {
	if m.opts.GracePeriod <= 0 {
		m.log.Info("graceful node shutdown is off (shutdownGracePeriod is 0): pods are not stopped before the machine goes down")
		return nil
	}
	var sigc chan os.Signal
	if m.opts.Signal != nil {
		sigc = make(chan os.Signal, 1)
		signal.Notify(sigc, m.opts.Signal)
		defer signal.Stop(sigc)
	}
	m.log.Info("graceful node shutdown on", "gracePeriod", m.opts.GracePeriod,
		"criticalGracePeriod", m.opts.CriticalGracePeriod, "signal", signalName(m.opts.Signal))

	var lg *logind
	defer func() {
		if lg != nil {
			lg.close()
		}
	}()
	retry := time.NewTimer(0)
	defer retry.Stop()
	backoff := reconnectMin
	triedOnce := false
	for {
		var events <-chan *busSignal
		if lg != nil {
			events = lg.signals
		}
		select {
		case <-ctx.Done():
			return nil
		case <-retry.C:
			var err error
			lg, err = connectLogind(ctx, m.opts.BusAddress, m.opts.GracePeriod, m.opts.LogindConfDir, m.log)
			if err != nil {
				lvl := slog.LevelDebug
				if !triedOnce {
					lvl = slog.LevelInfo
				}
				m.log.Log(ctx, lvl, "no systemd-logind to follow; a shutdown is noticed by the shutdown signal only",
					"signal", signalName(m.opts.Signal), "err", err, "retryIn", backoff)
				triedOnce = true
				retry.Reset(backoff)
				backoff = min(2*backoff, reconnectMax)
				continue
			}
			triedOnce, backoff = false, reconnectMin
		case s := <-sigc:
			m.log.Info("shutdown signal received; stopping pods", "signal", signalName(s))
			m.shutdown(ctx)
		case sig, ok := <-events:
			if !ok {
				m.log.Warn("lost the connection to systemd-logind; reconnecting")
				lg.close()
				lg = nil
				retry.Reset(reconnectMin)
				continue
			}
			active, err := prepareForShutdown(sig)
			if err != nil {
				continue // the bus's own signals (NameAcquired...) come on the same channel
			}
			if !active {
				// The shutdown was called off: admit pods again and hold a lock for the next one.
				m.log.Info("systemd-logind called the shutdown off")
				m.pods.CancelShutdown()
				if err := lg.inhibit(); err != nil {
					m.log.Warn("take a shutdown inhibitor lock again", "err", err)
				}
				continue
			}
			m.log.Info("systemd-logind announces a shutdown; stopping pods before letting it go on")
			m.shutdown(ctx)
			lg.release()
		}
	}
}

// shutdown stops the pods with the configured split of the grace period.
func (m *Manager) shutdown(ctx context.Context) {
	critical := m.opts.CriticalGracePeriod
	start := time.Now()
	m.pods.ShutdownPods(ctx, critical, m.opts.GracePeriod-critical)
	m.log.Info("pods stopped for the shutdown", "took", time.Since(start).Round(time.Millisecond))
}

// signalName is SIGPWR rather than "power failure", as the config file spells it.
func signalName(s os.Signal) string {
	switch s := s.(type) {
	case nil:
		return "none"
	case syscall.Signal:
		if n := unix.SignalName(s); n != "" {
			return n
		}
	}
	return s.String()
}
