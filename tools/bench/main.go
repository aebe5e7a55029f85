// Command bench measures mqlet as users run it: the real binary, driven through its manifest
// directory and local API, on a private containerd that the harness starts and stops itself,
// side by side with `ctr run` on the same containerd. It is run by scripts/bench.sh (`make bench`);
// BENCHMARKS.md says what each figure means.
//
// It writes the figures to -out only when every one of them was measured; any failure exits
// non-zero with the reason and leaves no results file behind.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/mqlet/mqlet/agent/api"
)

type config struct {
	containerdBin    string
	containerdConfig string
	socket           string
	namespace        string
	libDir           string // owned by the harness: containerd root, agent state, manifests
	runDir           string // owned by the harness: containerd state, pid files, API socket
	mqlet            string
	ctr              string
	binDir           string
	image            string
	imageArchive     string
	out              string
	samples          int
	step             time.Duration
	agentEnv         envList
	keepLogs         string
	mosquitto        string
	mqttFloor        string
	iptables         string
	only             stepSet
}

type bench struct {
	cfg    config
	client *containerd.Client
	ctrd   *daemon
	agent  *daemon
	rec    *recorder
	api    *api.Client
	log    io.Writer

	agentExtra []string // more agent flags (the MQTT figures' broker and back-off)
	brokers    []*broker
	floors     []*daemon
	counters   *counters
}

func (b *bench) path(name string) string    { return filepath.Join(b.cfg.libDir, name) }
func (b *bench) runPath(name string) string { return filepath.Join(b.cfg.runDir, name) }

func main() {
	var c config
	flag.StringVar(&c.containerdBin, "containerd", "/usr/bin/containerd", "containerd binary")
	flag.StringVar(&c.containerdConfig, "containerd-config", "", "config of the bench's private containerd (written by scripts/bench.sh)")
	flag.StringVar(&c.socket, "socket", "/run/mqlet-bench/containerd.sock", "socket the private containerd listens on (as in its config)")
	flag.StringVar(&c.namespace, "namespace", "mqlet-bench", "containerd namespace for everything the bench creates")
	flag.StringVar(&c.libDir, "lib-dir", "/var/lib/mqlet-bench", "directory owned by the bench, removed at the end")
	flag.StringVar(&c.runDir, "run-dir", "/run/mqlet-bench", "runtime directory owned by the bench, removed at the end")
	flag.StringVar(&c.mqlet, "mqlet", "bin/mqlet", "mqlet binary to measure")
	flag.StringVar(&c.ctr, "ctr", "ctr", "ctr binary, for the containerd floor")
	flag.StringVar(&c.binDir, "bin-dir", "bin", "directory holding mqlet-linux-{amd64,arm64,armv7} from `make cross`")
	flag.StringVar(&c.image, "image", "mqlet.test/busybox:1", "image the pods run")
	flag.StringVar(&c.imageArchive, "image-archive", "/var/lib/mqlet-test/images/busybox.tar", "docker-archive holding -image")
	flag.StringVar(&c.out, "out", "bench/results.json", "where the figures go")
	flag.IntVar(&c.samples, "samples", 25, "pod start samples (and as many ctr run samples), at least 20")
	flag.DurationVar(&c.step, "step-timeout", 60*time.Second, "bound on every single wait")
	flag.Var(&c.agentEnv, "agent-env", "KEY=VALUE added to the agent's environment, repeatable, for profiling: GODEBUG=gctrace=1 (output goes to the agent log), GOGC=50, GOMEMLIMIT=8MiB")
	flag.StringVar(&c.keepLogs, "keep-logs", "", "copy the agent and containerd logs into this directory before cleaning up")
	flag.StringVar(&c.mosquitto, "mosquitto", "/usr/sbin/mosquitto", "mosquitto binary, for the MQTT figures' brokers")
	flag.StringVar(&c.mqttFloor, "mqtt-floor", "", "the mqttfloor binary (tools/bench/mqttfloor), the idle link's floor")
	flag.StringVar(&c.iptables, "iptables", "/usr/sbin/iptables", "iptables binary, to count the MQTT links' bytes")
	flag.Var(&c.only, "only", "comma-separated steps to run, for development: "+strings.Join(stepKeys(), ",")+
		"; a step needs the ones before it, except mqtt, outbox, reconnect50, acks5000, eviction and idlecpu, which set up their own pods. A partial run writes no results file")
	flag.Parse()
	if c.containerdConfig == "" {
		fatal(errors.New("-containerd-config is required (scripts/bench.sh writes it)"))
	}
	if c.samples < 20 {
		fatal(fmt.Errorf("-samples %d: at least 20 are needed for a p90", c.samples))
	}
	for _, k := range c.only {
		if !slices.Contains(stepKeys(), k) {
			fatal(fmt.Errorf("-only %s: no such step; the steps are %s", k, strings.Join(stepKeys(), ",")))
		}
	}
	for _, p := range []*string{&c.mqlet, &c.binDir, &c.out, &c.containerdConfig} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			fatal(err)
		}
		*p = abs
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	b := &bench{cfg: c, rec: newRecorder(c.namespace), log: os.Stderr}
	// A results file from an earlier run must not pass for this run's if this one fails.
	if err := os.Remove(c.out); err != nil && !os.IsNotExist(err) {
		fatal(err)
	}
	res, runErr := b.run(ctx)
	cleanErr := b.cleanup()
	if runErr != nil {
		fatal(errors.Join(runErr, cleanErr))
	}
	if cleanErr != nil {
		fatal(fmt.Errorf("figures measured, but cleaning up failed: %w", cleanErr))
	}
	if len(c.only) > 0 {
		printResults(os.Stdout, res)
		fmt.Printf("\npartial run (-only %s): %s not written\n", strings.Join(c.only, ","), c.out)
		return
	}
	if err := writeResults(c.out, res); err != nil {
		fatal(err)
	}
	printResults(os.Stdout, res)
	fmt.Printf("\nwrote %s\n", c.out)
}

// stepSet is the -only flag: empty means every step.
type stepSet []string

func (s *stepSet) String() string { return strings.Join(*s, ",") }

func (s *stepSet) Set(v string) error {
	for _, k := range strings.Split(v, ",") {
		if k = strings.TrimSpace(k); k != "" {
			*s = append(*s, k)
		}
	}
	return nil
}

func (s stepSet) has(k string) bool { return len(s) == 0 || slices.Contains(s, k) }

func stepKeys() []string {
	var b bench
	var out []string
	for _, s := range b.steps() {
		out = append(out, s.key)
	}
	return out
}

// envList is a repeatable KEY=VALUE flag.
type envList []string

func (e *envList) String() string { return fmt.Sprint([]string(*e)) }

func (e *envList) Set(v string) error {
	if k, _, ok := strings.Cut(v, "="); !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", v)
	}
	*e = append(*e, v)
	return nil
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "bench: FAILED: %v\n", err)
	os.Exit(1)
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "bench: "+format+"\n", args...)
}

// results holds exactly the keys of bench/results.json, in order. Figures of parts that do not
// exist yet are nil, so they encode as null and never as a made-up number.
type results struct {
	BinaryAmd64MB    float64 `json:"binary_amd64_mb"`
	BinaryArm64MB    float64 `json:"binary_arm64_mb"`
	BinaryArmv7MB    float64 `json:"binary_armv7_mb"`
	IdleRSSMiB       float64 `json:"idle_rss_mib"`
	IdleAnonMiB      float64 `json:"idle_anon_mib"`
	RSS25PodsMiB     float64 `json:"rss_25_pods_mib"`
	Anon25PodsMiB    float64 `json:"anon_25_pods_mib"`
	IdleCPUPct25Pods float64 `json:"idle_cpu_pct_25_pods"` // percent of one core
	PodStartP50Ms    float64 `json:"pod_start_p50_ms"`
	PodStartP90Ms    float64 `json:"pod_start_p90_ms"`
	CtrRunP50Ms      float64 `json:"ctr_run_p50_ms"`
	CtrRunP90Ms      float64 `json:"ctr_run_p90_ms"`
	PodStartCNIP50Ms float64 `json:"pod_start_cni_p50_ms"` // issue 12: the same pod attached to a CNI network
	PodStartCNIP90Ms float64 `json:"pod_start_cni_p90_ms"`
	Burst20Ms        float64 `json:"burst20_ms"`
	CtrBurst20Ms     float64 `json:"ctr_burst20_ms"` // the floor: the same burst as 20 concurrent ctr run -d
	Recovery10PodsMs float64 `json:"recovery_10_pods_ms"`
	AgentStartMs     float64 `json:"agent_start_ms"`
	// outbox.go: bbolt commits per pod status drained (see BENCHMARKS.md).
	OutboxFsyncsPerStatus float64 `json:"outbox_fsyncs_per_status"`
	outbox                outboxRun
	// The MQTT figures (issue 9): see BENCHMARKS.md.
	MQTTApplyP50Ms   float64 `json:"mqtt_apply_to_running_ms"`
	MQTTApplyP90Ms   float64 `json:"mqtt_apply_to_running_p90_ms"`
	MQTTApplyAnonMiB float64 `json:"mqtt_apply_anon_mib"`
	// The same with the agent trusting one key and every index signed (issue 20).
	MQTTApplySignedP50Ms       float64 `json:"mqtt_apply_to_running_signed_ms"`
	MQTTApplySignedP90Ms       float64 `json:"mqtt_apply_to_running_signed_p90_ms"`
	MQTTApplySignedAnonMiB     float64 `json:"mqtt_apply_signed_anon_mib"`
	mqttSignedSamples          int
	IdleLinkKBPerHour          float64  `json:"idle_link_kb_per_hour"`
	IdleLinkFloorKBPerHour     float64  `json:"idle_link_floor_kb_per_hour"`
	IdleLinkPahoDefaultsKBPerH float64  `json:"idle_link_paho_defaults_kb_per_hour"`
	ReconnectConvergeMs        float64  `json:"reconnect_converge_ms"`
	ReconnectAfterOnlineMs     float64  `json:"reconnect_after_online_ms"` // the agent's new online message -> converged
	ReconnectBytes             float64  `json:"reconnect_bytes"`
	ReconnectStatusMessages    int      `json:"reconnect_status_messages"`
	ReconnectStatusChanges     int      `json:"reconnect_status_changes"`
	FleetNodes                 *float64 `json:"fleet_nodes"`
	FleetReadyS                *float64 `json:"fleet_ready_s"`
	BridgeCPUPct               *float64 `json:"bridge_cpu_pct"`
	BridgeRSSMiB               *float64 `json:"bridge_rss_mib"`
	// Issue 10: see BENCHMARKS.md.
	EvictionMs         float64 `json:"eviction_ms"`
	ProbeCPUPct25Pods  float64 `json:"probe_cpu_pct_25_pods"` // issue 11, percent of one core: see BENCHMARKS.md
	ProbeAnonDeltaMiB  float64 `json:"probe_anon_delta_mib"`  // issue 11
	breakdown          []breakdownRow
	ctrEventP50Ms      float64
	podStartSamples    int
	cniSamples         int
	cniCtrRunP50Ms     float64 // ctr run samples interleaved with the CNI ones
	agentStartFirstAPI float64
	burstCPU           struct{ agent, containerd, shims float64 }
	idleCPU            struct{ cpuMs, wallS float64 }
	mqttApplySamples   int
	idleLink           []idleResult // agent, floor, paho defaults
	reconnect          struct {
		online    float64 // broker up -> the agent's new online message, ms
		conv, all linkCount
		pubs      publishCounts
	}
	eviction struct {
		max, decide float64 // ms: the slowest sample; crossing -> the agent's decision (median)
		samples     int
	}
	ran []string // keys of the steps that ran

	probes struct{ base, probed probeRun } // issue 11's two runs

	// Protocol v2 (reconnect50.go, acksjobs.go): see BENCHMARKS.md.
	ReconnectBytes50Pods1Changed float64    `json:"reconnect_bytes_50_mqtt_pods_1_changed"`
	ReconnectFloorBytes1Changed  float64    `json:"reconnect_floor_bytes_1_changed"`
	AcksBytesAfter5000Jobs       float64    `json:"acks_bytes_after_5000_jobs"`
	reconnect50                  r50Result  // reconnect50.go
	jobs                         jobsResult // acksjobs.go
}

// burstRatio is the burst target as a share of containerd's own burst: the burst is bound by
// containerd (see BENCHMARKS.md), so a fixed number of milliseconds would measure the machine.
const burstRatio = 0.8

func (r results) burstTarget() float64 { return burstRatio * r.CtrBurst20Ms }

// burstMet needs a measured floor: without one, no burst could be under 0.8 x of it.
func (r results) burstMet() bool { return r.CtrBurst20Ms > 0 && r.Burst20Ms <= r.burstTarget() }

func writeResults(path string, r results) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func printResults(w io.Writer, r results) {
	ran := func(k string) bool { return slices.Contains(r.ran, k) }
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "FIGURE\tVALUE\tTARGET\t")
	row := func(name string, v float64, unit, target string, ok bool) {
		mark := "ok"
		if !ok {
			mark = "MISSED"
		}
		fmt.Fprintf(tw, "%s\t%.1f %s\t%s\t%s\n", name, v, unit, target, mark)
	}
	info := func(name string, v float64, unit, note string) {
		fmt.Fprintf(tw, "%s\t%.1f %s\t%s\t\n", name, v, unit, note)
	}
	if ran("start") {
		row("pod_start_p50_ms", r.PodStartP50Ms, "ms", fmt.Sprintf("<= 100 and <= 1.2 x ctr (%.1f)", 1.2*r.CtrRunP50Ms),
			r.PodStartP50Ms <= 100 && r.PodStartP50Ms <= 1.2*r.CtrRunP50Ms)
		info("pod_start_p90_ms", r.PodStartP90Ms, "ms", fmt.Sprintf("(%d samples)", r.podStartSamples))
		info("ctr_run_p50_ms", r.CtrRunP50Ms, "ms", fmt.Sprintf("floor; to its task-start event: %.1f ms", r.ctrEventP50Ms))
		info("ctr_run_p90_ms", r.CtrRunP90Ms, "ms", "")
	}
	if ran("startcni") {
		row("pod_start_cni_p50_ms", r.PodStartCNIP50Ms, "ms", fmt.Sprintf("<= 1.5 x ctr (%.1f)", r.cniTarget()), r.PodStartCNIP50Ms <= r.cniTarget())
		info("pod_start_cni_p90_ms", r.PodStartCNIP90Ms, "ms", fmt.Sprintf("(%d samples; ctr run interleaved with them: p50 %.1f ms)", r.cniSamples, r.cniCtrRunP50Ms))
	}
	if ran("burst") {
		row("burst20_ms", r.Burst20Ms, "ms", fmt.Sprintf("<= %.1f x ctr burst (%.1f)", burstRatio, r.burstTarget()), r.burstMet())
		info("ctr_burst20_ms", r.CtrBurst20Ms, "ms", "floor: 20 concurrent ctr run -d")
		fmt.Fprintf(tw, "  CPU used in the burst\tagent %.0f ms\tcontainerd %.0f ms, shims+runc %.0f ms (%d CPUs x burst: %.0f ms)\t\n",
			r.burstCPU.agent, r.burstCPU.containerd, r.burstCPU.shims, runtime.NumCPU(), float64(runtime.NumCPU())*r.Burst20Ms)
	}
	if ran("idle") {
		row("idle_rss_mib", r.IdleRSSMiB, "MiB", "<= 20", r.IdleRSSMiB <= 20)
		row("idle_anon_mib", r.IdleAnonMiB, "MiB", "<= 6", r.IdleAnonMiB <= 6)
	}
	if ran("pods25") {
		row("rss_25_pods_mib", r.RSS25PodsMiB, "MiB", "<= 26", r.RSS25PodsMiB <= 26)
		row("anon_25_pods_mib", r.Anon25PodsMiB, "MiB", "<= 10", r.Anon25PodsMiB <= 10)
	}
	if ran("idlecpu") {
		row("idle_cpu_pct_25_pods", r.IdleCPUPct25Pods, "% of a core", fmt.Sprintf("< %.1f (%.2f %%: agent CPU %.0f ms in %.1f s)", idleCPUTarget, r.IdleCPUPct25Pods, r.idleCPU.cpuMs, r.idleCPU.wallS),
			r.IdleCPUPct25Pods < idleCPUTarget)
	}
	if ran("recovery") {
		row("recovery_10_pods_ms", r.Recovery10PodsMs, "ms", "<= 2000", r.Recovery10PodsMs <= 2000)
	}
	if ran("agentstart") {
		row("agent_start_ms", r.AgentStartMs, "ms", fmt.Sprintf("<= 300 (pods listed Running at %.1f ms)", r.agentStartFirstAPI), r.AgentStartMs <= 300)
	}
	printOutbox(tw, r, ran) // outbox.go
	if ran("binaries") {
		info("binary_amd64_mb", r.BinaryAmd64MB, "MB", "1 MB = 1e6 bytes")
		row("binary_arm64_mb", r.BinaryArm64MB, "MB", "<= 25", r.BinaryArm64MB <= 25)
		info("binary_armv7_mb", r.BinaryArmv7MB, "MB", "")
	}
	if ran("mqtt") {
		note := fmt.Sprintf("p90 %.1f ms (%d samples)", r.MQTTApplyP90Ms, r.mqttApplySamples)
		if ran("start") {
			note += fmt.Sprintf("; manifest dir: p50 %.1f ms", r.PodStartP50Ms)
		}
		info("mqtt_apply_to_running_ms", r.MQTTApplyP50Ms, "ms", note)
		info("mqtt_apply_to_running_signed_ms", r.MQTTApplySignedP50Ms, "ms",
			fmt.Sprintf("the same with a trust anchor and signed indexes: p90 %.1f ms (%d samples); agent anon after the applies %.1f MiB signed, %.1f MiB unsigned",
				r.MQTTApplySignedP90Ms, r.mqttSignedSamples, r.MQTTApplySignedAnonMiB, r.MQTTApplyAnonMiB))
		floor := r.IdleLinkFloorKBPerHour
		row("idle_link_kb_per_hour", r.IdleLinkKBPerHour, "KB/h", fmt.Sprintf("<= 20 and <= 1.2 x floor (%.1f)", 1.2*floor),
			r.IdleLinkKBPerHour <= 20 && r.IdleLinkKBPerHour <= 1.2*floor)
		info("idle_link_floor_kb_per_hour", floor, "KB/h", "floor: bare paho client, MQTT keepalive only (TCP keepalive off)")
		info("idle_link_paho_defaults_kb_per_hour", r.IdleLinkPahoDefaultsKBPerH, "KB/h", "bare paho client, paho's default dialer (Go's TCP keepalive)")
		for i, who := range []string{"agent", "floor", "paho defaults"} {
			if i >= len(r.idleLink) {
				break
			}
			x := r.idleLink[i]
			flags := ""
			if x.NoStart || x.NoPing {
				flags = " (window not at keepalive edges: the client sent no data at one end)"
			}
			fmt.Fprintf(tw, "  idle window, %s\t%.1f s\t%d PINGREQ; up %d B in %d packets, down %d B in %d packets%s\t\n",
				who, x.Seconds, x.Count.Pings, x.Count.Up, x.Count.UpPkts, x.Count.Down, x.Count.DnPkts, flags)
		}
		row("reconnect_converge_ms", r.ReconnectConvergeMs, "ms", "<= 1000", r.ReconnectConvergeMs <= 1000)
		fmt.Fprintf(tw, "  broker up -> agent online\t%.1f ms\t(agent reconnect back-off capped at %s: full jitter, 0 to 1 s)\t\n", r.reconnect.online, reconnectMax)
		info("reconnect_after_online_ms", r.ReconnectAfterOnlineMs, "ms", "agent online -> last status matched (the outbox drain)")
		info("reconnect_bytes", r.ReconnectBytes, "B", fmt.Sprintf("to convergence: up %d B, down %d B; until quiet %d B",
			r.reconnect.conv.Up, r.reconnect.conv.Down, r.reconnect.all.total()))
		pods := 10
		row("reconnect_status_messages", float64(r.ReconnectStatusMessages), "", fmt.Sprintf("<= %d (one per changed pod), for %d changes", pods, r.ReconnectStatusChanges),
			r.ReconnectStatusMessages <= pods)
		info("reconnect_status_changes", float64(r.ReconnectStatusChanges), "", "container replacements while the broker was down (containerd's /tasks/start)")
		fmt.Fprintf(tw, "  PUBLISH from the agent\t%s\t%d payload bytes\t\n", classes(r.reconnect.pubs.received), r.reconnect.pubs.receivedBytes)
		fmt.Fprintf(tw, "  PUBLISH to the agent\t%s\t%d payload bytes\t\n", classes(r.reconnect.pubs.sent), r.reconnect.pubs.sentBytes)
	}
	if ran("eviction") {
		row("eviction_ms", r.EvictionMs, "ms", "<= 2000", r.EvictionMs <= 2000)
		fmt.Fprintf(tw, "  memory-pressure crossing -> /tasks/exit\tmedian of %d, slowest %.1f ms\tthe agent decided at %.1f ms (median)\t\n",
			r.eviction.samples, r.eviction.max, r.eviction.decide)
	}
	if ran("probes") {
		p := r.probes
		row("probe_cpu_pct_25_pods", r.ProbeCPUPct25Pods, "% of a core", fmt.Sprintf("< %.1f (agent CPU %.0f ms in %.1f s; without probes %.2f %%)", probeCPUTarget, p.probed.cpuMs, p.probed.wallS, p.base.cpuPct),
			r.ProbeCPUPct25Pods < probeCPUTarget)
		row("probe_anon_delta_mib", r.ProbeAnonDeltaMiB, "MiB", fmt.Sprintf("< %.1f (mean anon over %d s: %.1f MiB with probes, %.1f without; at the end %.1f and %.1f)",
			probeAnonTarget, p.probed.samples, p.probed.anonMiB, p.base.anonMiB, p.probed.anonEnd, p.base.anonEnd),
			r.ProbeAnonDeltaMiB < probeAnonTarget)
	}
	printV2(tw, r, ran) // reconnect50.go, acksjobs.go
	tw.Flush()

	if ran("start") {
		fmt.Fprintln(w, "\nwhere a start goes (medians; t0 = manifest renamed in / ctr exec'd; containerd's event timestamps):")
		tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "STEP\tmqlet\tctr run\t")
		for _, br := range r.breakdown {
			fmt.Fprintf(tw, "%s\t%.1f ms\t%.1f ms\t\n", br.step, br.agent, br.ctr)
		}
		tw.Flush()
	}
}

func classes(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
