package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Flags is embedded in the kong command of `mqlet agent`. The setting flags are pointers (and a
// slice) so that an absent flag stays nil and does not override the file or the environment;
// for that reason none of them has a kong `default` tag and the defaults are written in the help.
type Flags struct {
	Config string `name:"config" env:"MQLET_CONFIG" placeholder:"FILE" help:"YAML config file (see configs/mqlet.yaml); flags and MQLET_* variables override it (default none)."`

	NodeName            *string        `name:"node-name" placeholder:"NAME" help:"Name of this node, a DNS-1123 subdomain (default the hostname, lowercased)."`
	StateDir            *string        `name:"state-dir" placeholder:"DIR" help:"Directory for the state database and container logs (default ${state_dir})."`
	ContainerdAddress   *string        `name:"containerd-address" placeholder:"SOCKET" help:"containerd socket, a path or unix://path (default ${containerd_address})."`
	ContainerdNamespace *string        `name:"containerd-namespace" placeholder:"NS" help:"containerd namespace that holds mqlet's containers and images (default ${containerd_namespace})."`
	ManifestDir         *string        `name:"manifest-dir" placeholder:"DIR" help:"Directory of static pod manifests (default ${manifest_dir})."`
	ImagePreloadDir     *string        `name:"image-preload-dir" placeholder:"DIR" help:"Image archives imported at start when not already present (default ${image_preload_dir})."`
	APISocket           *string        `name:"api-socket" placeholder:"SOCKET" help:"Unix socket of the local API used by the mqlet CLI (default ${api_socket})."`
	LogLevel            *string        `name:"log-level" placeholder:"LEVEL" help:"Log level: debug, info, warn or error (default ${log_level})."`
	LogFormat           *string        `name:"log-format" placeholder:"FORMAT" help:"Log format: text or json (default ${log_format})."`
	Once                *bool          `name:"once" help:"Start the pods once, wait for them to run or finish, then exit (default false)."`
	OnceTimeout         *time.Duration `name:"once-timeout" placeholder:"DURATION" help:"How long --once waits for the pods (default ${once_timeout})."`
	RelistPeriod        *time.Duration `name:"relist-period" placeholder:"DURATION" help:"Period of the containerd relist that catches missed events, at least 1s (default ${relist_period})."`
	ContainerdTimeout   *time.Duration `name:"containerd-timeout" placeholder:"DURATION" help:"Timeout for connecting to containerd (default ${containerd_timeout})."`
	PlainHTTPRegistries []string       `name:"plain-http-registry" placeholder:"HOST[:PORT]" help:"Registry pulled over plain HTTP instead of TLS; repeatable or comma-separated (default none)."`
	RegistryCAFile      *string        `name:"registry-ca-file" placeholder:"FILE" help:"Extra CA bundle (PEM) trusted for TLS registries (default none)."`

	MQTTBroker       *string        `name:"mqtt-broker" placeholder:"URL" help:"MQTT broker, scheme://host:port with scheme tcp, ssl, tls, ws or wss (mqtt means tcp, mqtts ssl); empty runs standalone with the manifest dir as the only source (default none)."`
	MQTTCAFile       *string        `name:"mqtt-ca-file" placeholder:"FILE" help:"CA bundle (PEM) for the broker's certificate, instead of the system roots; ssl, tls and wss brokers only (default none)."`
	MQTTCertFile     *string        `name:"mqtt-cert-file" placeholder:"FILE" help:"Client certificate (PEM) for brokers that authenticate nodes by TLS; needs --mqtt-key-file (default none)."`
	MQTTKeyFile      *string        `name:"mqtt-key-file" placeholder:"FILE" help:"Private key (PEM) of --mqtt-cert-file, readable by its owner only (chmod 600: a key others can read is refused) (default none)."`
	MQTTUsername     *string        `name:"mqtt-username" placeholder:"NAME" help:"MQTT user name (default none)."`
	MQTTTrustedKeys  []string       `name:"mqtt-trusted-key" placeholder:"FILE" help:"Public key (PEM, from mqlet ctl keygen) whose signature desired state must carry; repeatable for a key rotation; without any, every index on the broker is taken, with a warning (default none)."`
	MQTTPasswordFile *string        `name:"mqtt-password-file" placeholder:"FILE" help:"File holding the MQTT password, readable by its owner only (chmod 600); the password is never logged (default none)."`
	MQTTKeepalive    *time.Duration `name:"mqtt-keepalive" placeholder:"DURATION" help:"MQTT keepalive in whole seconds, 5s to 65535s; the broker declares the node offline after 1.5 times this without traffic (default ${mqtt_keepalive})."`
	MQTTTopicPrefix  *string        `name:"mqtt-topic-prefix" placeholder:"PREFIX" help:"First levels of every MQTT topic: PREFIX/nodes/NODE/... (default ${mqtt_topic_prefix})."`
	MQTTReconnectMax *time.Duration `name:"mqtt-reconnect-max" placeholder:"DURATION" help:"Longest wait between attempts to reach the broker, at least 1s (default ${mqtt_reconnect_max})."`
	MQTTMaxPayload   *int64         `name:"mqtt-max-payload" placeholder:"BYTES" help:"Largest MQTT message sent or accepted, 1024 to 268435455 bytes (default ${mqtt_max_payload})."`
	OutboxMaxBytes   *int64         `name:"outbox-max-bytes" placeholder:"BYTES" help:"Most bytes of reports kept for the broker while it is unreachable, at least 65536 (default ${outbox_max_bytes})."`
	SecretKeyFile    *string        `name:"secret-key-file" placeholder:"FILE" help:"Node key that seals secrets in the state store; must lie outside --state-dir (default ${secret_key_file})."`

	NodeStatusUpdateFrequency *time.Duration `name:"node-status-update-frequency" placeholder:"DURATION" help:"How often the node status is computed; it is reported only when it changes (default ${node_status_update_frequency})."`
	NodeStatusMaxImages       *int64         `name:"node-status-max-images" placeholder:"N" help:"Most images listed in the node status, largest first; 0 lists none (default ${node_status_max_images})."`
	NodeLabels                []string       `name:"node-label" placeholder:"KEY=VALUE" help:"Label of the node; repeatable or comma-separated (default none)."`
	NodeTaints                []string       `name:"node-taint" placeholder:"KEY[=VALUE]:EFFECT" help:"Taint of the node, EFFECT one of NoSchedule, PreferNoSchedule, NoExecute; repeatable or comma-separated (default none)."`
	MaxPods                   *int64         `name:"max-pods" placeholder:"N" help:"Most pods this node runs (default ${max_pods})."`
	ImageFSDir                *string        `name:"image-fs-dir" placeholder:"DIR" help:"containerd's root directory, whose file system holds images: the imagefs of eviction and image GC (default ${image_fs_dir})."`

	CgroupRoot             *string  `name:"cgroup-root" placeholder:"PATH" help:"cgroup under which pods run: PATH/NAMESPACE/{burstable,besteffort}/pod<uid> (default ${cgroup_root})."`
	EnforceNodeAllocatable *bool    `name:"enforce-node-allocatable" help:"Limit all pods together to node allocatable on the cgroup above them (default true)."`
	SystemReserved         []string `name:"system-reserved" placeholder:"RES=QTY" help:"Resources kept for the OS, e.g. cpu=200m,memory=150Mi,ephemeral-storage=1Gi,pid=1000 (default none)."`
	AgentReserved          []string `name:"agent-reserved" placeholder:"RES=QTY" help:"Resources kept for mqlet and containerd, as --system-reserved (default none)."`
	PodPidsLimit           *int64   `name:"pod-pids-limit" placeholder:"N" help:"Most processes (pids.max) one pod may have; -1 for no limit (default ${pod_pids_limit})."`
	SingleProcessOOMKill   *bool    `name:"single-process-oom-kill" help:"cgroup v2: let the kernel's OOM killer end one process of a container rather than all of it (memory.oom.group=0) (default false)."`

	EvictionHard                     []string       `name:"eviction-hard" placeholder:"SIGNAL<VALUE" help:"Hard eviction thresholds, e.g. memory.available<100Mi,nodefs.available<10%; replaces the defaults (default ${eviction_hard})."`
	EvictionSoft                     []string       `name:"eviction-soft" placeholder:"SIGNAL<VALUE" help:"Soft eviction thresholds; each needs --eviction-soft-grace-period (default none)."`
	EvictionSoftGracePeriod          []string       `name:"eviction-soft-grace-period" placeholder:"SIGNAL=DURATION" help:"How long a soft threshold must hold before it evicts (default none)."`
	EvictionMinimumReclaim           []string       `name:"eviction-minimum-reclaim" placeholder:"SIGNAL=VALUE" help:"Reclaim this much beyond a crossed threshold (default none)."`
	EvictionPressureTransitionPeriod *time.Duration `name:"eviction-pressure-transition-period" placeholder:"DURATION" help:"How long a pressure condition stays after its threshold is no longer crossed (default ${eviction_pressure_transition_period})."`
	EvictionMaxPodGracePeriod        *time.Duration `name:"eviction-max-pod-grace-period" placeholder:"DURATION" help:"Longest grace period a pod evicted by a soft threshold gets; 0 uses the pod's own, where kubelet's 0 stops the pod at once (default 0s)."`
	EvictionMonitoringPeriod         *time.Duration `name:"eviction-monitoring-period" placeholder:"DURATION" help:"How often eviction signals are read; memory is also re-checked on kernel notification where available (default ${eviction_monitoring_period})."`

	ImageGCHighThresholdPercent *int64         `name:"image-gc-high-threshold" placeholder:"PERCENT" help:"Image file system usage that starts image garbage collection (default ${image_gc_high})."`
	ImageGCLowThresholdPercent  *int64         `name:"image-gc-low-threshold" placeholder:"PERCENT" help:"Usage image garbage collection brings the image file system down to (default ${image_gc_low})."`
	ImageMinimumGCAge           *time.Duration `name:"image-minimum-gc-age" placeholder:"DURATION" help:"Minimum age of an unused image before it may be removed (default ${image_minimum_gc_age})."`

	Devices []string `name:"device" placeholder:"NAME=GLOB[:SHARE]" help:"Host devices offered as a resource, e.g. mqlet.io/serial=/dev/ttyUSB*; SHARE pods may share one device (default 1); repeatable (default none)."`

	ShutdownGracePeriod             *time.Duration `name:"shutdown-grace-period" placeholder:"DURATION" help:"Time pods get to stop when the system shuts down; 0 turns graceful node shutdown off (default ${shutdown_grace_period})."`
	ShutdownGracePeriodCriticalPods *time.Duration `name:"shutdown-grace-period-critical-pods" placeholder:"DURATION" help:"Part of --shutdown-grace-period kept for critical pods, which stop last (default ${shutdown_grace_period_critical})."`
	ShutdownSignal                  *string        `name:"shutdown-signal" placeholder:"SIGNAL" help:"Signal that announces a system shutdown where systemd-logind is absent; empty for none (default ${shutdown_signal})."`

	MetricsAddress *string `name:"metrics-address" placeholder:"HOST[:PORT]" help:"Also serve /metrics, /healthz and /readyz over TCP here; a host alone listens on port 10264 (default none)."`

	CNIConfDir    *string  `name:"cni-conf-dir" placeholder:"DIR" help:"CNI network configurations; when it holds none, mqlet writes its own bridge network there (default ${cni_conf_dir})."`
	CNIBinDirs    []string `name:"cni-bin-dir" placeholder:"DIR" help:"Directories searched for CNI plugin binaries, in order; repeatable or comma-separated (default ${cni_bin_dirs})."`
	PodCIDR       *string  `name:"pod-cidr" placeholder:"CIDR" help:"Pod addresses of the default CNI network mqlet writes (default ${pod_cidr})."`
	ClusterDNS    []string `name:"cluster-dns" placeholder:"IP" help:"DNS servers of ClusterFirst pods; with none, ClusterFirst falls back to Default as kubelet does; repeatable or comma-separated (default none)."`
	ClusterDomain *string  `name:"cluster-domain" placeholder:"DOMAIN" help:"Cluster domain for the search list of ClusterFirst pods (default ${cluster_domain})."`
	ResolvConf    *string  `name:"resolv-conf" placeholder:"FILE" help:"Resolver file that Default-policy pods inherit; empty for none (default ${resolv_conf})."`

	ContainerLogMaxSize  *string  `name:"container-log-max-size" placeholder:"QTY" help:"Size at which a container log file is rotated, e.g. 10Mi (default ${container_log_max_size})."`
	ContainerLogMaxFiles *int64   `name:"container-log-max-files" placeholder:"N" help:"Log files kept per container, the current one included, at least 2 (default ${container_log_max_files})."`
	AllowedUnsafeSysctls []string `name:"allowed-unsafe-sysctl" placeholder:"NAME" help:"Sysctl (or prefix ending in *) pods may set beyond the safe set; repeatable or comma-separated (default none)."`
	RegistryAuthFile     *string  `name:"registry-auth-file" placeholder:"FILE" help:"Node-wide registry credentials, a docker config.json ({\"auths\": ...}), readable by its owner only (default none)."`

	MQTTAllowPrivileged     *bool    `name:"mqtt-allow-privileged" help:"Let pods from MQTT be privileged, escalate privileges or add capabilities beyond the baseline set (default false)."`
	MQTTAllowHostNamespaces *bool    `name:"mqtt-allow-host-namespaces" help:"Let pods from MQTT use hostNetwork, hostPID and hostIPC (default false)."`
	MQTTAllowedHostPaths    []string `name:"mqtt-allowed-host-path" placeholder:"DIR" help:"Host directory that pods from MQTT may mount as hostPath, with what lies below it; repeatable or comma-separated (default none)."`
}

// setting ties one Config field to its YAML key, flag and environment variable, so that every
// message can name a setting the way the user may have written it.
type setting struct {
	key   string
	flag  string
	env   string
	field func(c *Config) any // pointer to the Config field
}

func settings() []setting {
	return []setting{
		{"nodeName", "node-name", "MQLET_NODE_NAME", func(c *Config) any { return &c.NodeName }},
		{"stateDir", "state-dir", "MQLET_STATE_DIR", func(c *Config) any { return &c.StateDir }},
		{"containerdAddress", "containerd-address", "MQLET_CONTAINERD_ADDRESS", func(c *Config) any { return &c.ContainerdAddress }},
		{"containerdNamespace", "containerd-namespace", "MQLET_CONTAINERD_NAMESPACE", func(c *Config) any { return &c.ContainerdNamespace }},
		{"manifestDir", "manifest-dir", "MQLET_MANIFEST_DIR", func(c *Config) any { return &c.ManifestDir }},
		{"imagePreloadDir", "image-preload-dir", "MQLET_IMAGE_PRELOAD_DIR", func(c *Config) any { return &c.ImagePreloadDir }},
		{"apiSocket", "api-socket", "MQLET_API_SOCKET", func(c *Config) any { return &c.APISocket }},
		{"logLevel", "log-level", "MQLET_LOG_LEVEL", func(c *Config) any { return &c.LogLevel }},
		{"logFormat", "log-format", "MQLET_LOG_FORMAT", func(c *Config) any { return &c.LogFormat }},
		{"once", "once", "MQLET_ONCE", func(c *Config) any { return &c.Once }},
		{"onceTimeout", "once-timeout", "MQLET_ONCE_TIMEOUT", func(c *Config) any { return &c.OnceTimeout }},
		{"relistPeriod", "relist-period", "MQLET_RELIST_PERIOD", func(c *Config) any { return &c.RelistPeriod }},
		{"containerdTimeout", "containerd-timeout", "MQLET_CONTAINERD_TIMEOUT", func(c *Config) any { return &c.ContainerdTimeout }},
		{"plainHTTPRegistries", "plain-http-registry", "MQLET_PLAIN_HTTP_REGISTRIES", func(c *Config) any { return &c.PlainHTTPRegistries }},
		{"registryCAFile", "registry-ca-file", "MQLET_REGISTRY_CA_FILE", func(c *Config) any { return &c.RegistryCAFile }},
		{"mqttBroker", "mqtt-broker", "MQLET_MQTT_BROKER", func(c *Config) any { return &c.MQTTBroker }},
		{"mqttCAFile", "mqtt-ca-file", "MQLET_MQTT_CA_FILE", func(c *Config) any { return &c.MQTTCAFile }},
		{"mqttCertFile", "mqtt-cert-file", "MQLET_MQTT_CERT_FILE", func(c *Config) any { return &c.MQTTCertFile }},
		{"mqttKeyFile", "mqtt-key-file", "MQLET_MQTT_KEY_FILE", func(c *Config) any { return &c.MQTTKeyFile }},
		{"mqttUsername", "mqtt-username", "MQLET_MQTT_USERNAME", func(c *Config) any { return &c.MQTTUsername }},
		{"mqttPasswordFile", "mqtt-password-file", "MQLET_MQTT_PASSWORD_FILE", func(c *Config) any { return &c.MQTTPasswordFile }},
		{"mqttTrustedKeys", "mqtt-trusted-key", "MQLET_MQTT_TRUSTED_KEY", func(c *Config) any { return &c.MQTTTrustedKeys }},
		{"mqttKeepalive", "mqtt-keepalive", "MQLET_MQTT_KEEPALIVE", func(c *Config) any { return &c.MQTTKeepalive }},
		{"mqttTopicPrefix", "mqtt-topic-prefix", "MQLET_MQTT_TOPIC_PREFIX", func(c *Config) any { return &c.MQTTTopicPrefix }},
		{"mqttReconnectMax", "mqtt-reconnect-max", "MQLET_MQTT_RECONNECT_MAX", func(c *Config) any { return &c.MQTTReconnectMax }},
		{"mqttMaxPayload", "mqtt-max-payload", "MQLET_MQTT_MAX_PAYLOAD", func(c *Config) any { return &c.MQTTMaxPayload }},
		{"outboxMaxBytes", "outbox-max-bytes", "MQLET_OUTBOX_MAX_BYTES", func(c *Config) any { return &c.OutboxMaxBytes }},
		{"secretKeyFile", "secret-key-file", "MQLET_SECRET_KEY_FILE", func(c *Config) any { return &c.SecretKeyFile }},
		// Keys with a dot live in a mapping of the config file (mqttPolicy: {allowPrivileged: ...}).
		{"mqttPolicy.allowPrivileged", "mqtt-allow-privileged", "MQLET_MQTT_ALLOW_PRIVILEGED", func(c *Config) any { return &c.MQTTPolicy.AllowPrivileged }},
		{"mqttPolicy.allowHostNamespaces", "mqtt-allow-host-namespaces", "MQLET_MQTT_ALLOW_HOST_NAMESPACES", func(c *Config) any { return &c.MQTTPolicy.AllowHostNamespaces }},
		{"mqttPolicy.allowedHostPaths", "mqtt-allowed-host-path", "MQLET_MQTT_ALLOWED_HOST_PATHS", func(c *Config) any { return &c.MQTTPolicy.AllowedHostPaths }},

		{"nodeStatusUpdateFrequency", "node-status-update-frequency", "MQLET_NODE_STATUS_UPDATE_FREQUENCY", func(c *Config) any { return &c.NodeStatusUpdateFrequency }},
		{"nodeStatusMaxImages", "node-status-max-images", "MQLET_NODE_STATUS_MAX_IMAGES", func(c *Config) any { return &c.NodeStatusMaxImages }},
		{"nodeLabels", "node-label", "MQLET_NODE_LABELS", func(c *Config) any { return &c.NodeLabels }},
		{"nodeTaints", "node-taint", "MQLET_NODE_TAINTS", func(c *Config) any { return &c.NodeTaints }},
		{"maxPods", "max-pods", "MQLET_MAX_PODS", func(c *Config) any { return &c.MaxPods }},
		{"imageFSDir", "image-fs-dir", "MQLET_IMAGE_FS_DIR", func(c *Config) any { return &c.ImageFSDir }},
		{"cgroupRoot", "cgroup-root", "MQLET_CGROUP_ROOT", func(c *Config) any { return &c.CgroupRoot }},
		{"enforceNodeAllocatable", "enforce-node-allocatable", "MQLET_ENFORCE_NODE_ALLOCATABLE", func(c *Config) any { return &c.EnforceNodeAllocatable }},
		{"systemReserved", "system-reserved", "MQLET_SYSTEM_RESERVED", func(c *Config) any { return &c.SystemReserved }},
		{"agentReserved", "agent-reserved", "MQLET_AGENT_RESERVED", func(c *Config) any { return &c.AgentReserved }},
		{"podPidsLimit", "pod-pids-limit", "MQLET_POD_PIDS_LIMIT", func(c *Config) any { return &c.PodPidsLimit }},
		{"singleProcessOOMKill", "single-process-oom-kill", "MQLET_SINGLE_PROCESS_OOM_KILL", func(c *Config) any { return &c.SingleProcessOOMKill }},
		{"evictionHard", "eviction-hard", "MQLET_EVICTION_HARD", func(c *Config) any { return &c.EvictionHard }},
		{"evictionSoft", "eviction-soft", "MQLET_EVICTION_SOFT", func(c *Config) any { return &c.EvictionSoft }},
		{"evictionSoftGracePeriod", "eviction-soft-grace-period", "MQLET_EVICTION_SOFT_GRACE_PERIOD", func(c *Config) any { return &c.EvictionSoftGracePeriod }},
		{"evictionMinimumReclaim", "eviction-minimum-reclaim", "MQLET_EVICTION_MINIMUM_RECLAIM", func(c *Config) any { return &c.EvictionMinimumReclaim }},
		{"evictionPressureTransitionPeriod", "eviction-pressure-transition-period", "MQLET_EVICTION_PRESSURE_TRANSITION_PERIOD", func(c *Config) any { return &c.EvictionPressureTransitionPeriod }},
		{"evictionMaxPodGracePeriod", "eviction-max-pod-grace-period", "MQLET_EVICTION_MAX_POD_GRACE_PERIOD", func(c *Config) any { return &c.EvictionMaxPodGracePeriod }},
		{"evictionMonitoringPeriod", "eviction-monitoring-period", "MQLET_EVICTION_MONITORING_PERIOD", func(c *Config) any { return &c.EvictionMonitoringPeriod }},
		{"imageGCHighThresholdPercent", "image-gc-high-threshold", "MQLET_IMAGE_GC_HIGH_THRESHOLD", func(c *Config) any { return &c.ImageGCHighThresholdPercent }},
		{"imageGCLowThresholdPercent", "image-gc-low-threshold", "MQLET_IMAGE_GC_LOW_THRESHOLD", func(c *Config) any { return &c.ImageGCLowThresholdPercent }},
		{"imageMinimumGCAge", "image-minimum-gc-age", "MQLET_IMAGE_MINIMUM_GC_AGE", func(c *Config) any { return &c.ImageMinimumGCAge }},
		{"devices", "device", "MQLET_DEVICES", func(c *Config) any { return &c.Devices }},
		{"shutdownGracePeriod", "shutdown-grace-period", "MQLET_SHUTDOWN_GRACE_PERIOD", func(c *Config) any { return &c.ShutdownGracePeriod }},
		{"shutdownGracePeriodCriticalPods", "shutdown-grace-period-critical-pods", "MQLET_SHUTDOWN_GRACE_PERIOD_CRITICAL_PODS", func(c *Config) any { return &c.ShutdownGracePeriodCriticalPods }},
		{"shutdownSignal", "shutdown-signal", "MQLET_SHUTDOWN_SIGNAL", func(c *Config) any { return &c.ShutdownSignal }},
		{"metricsAddress", "metrics-address", "MQLET_METRICS_ADDRESS", func(c *Config) any { return &c.MetricsAddress }},
		{"cniConfDir", "cni-conf-dir", "MQLET_CNI_CONF_DIR", func(c *Config) any { return &c.CNIConfDir }},
		{"cniBinDirs", "cni-bin-dir", "MQLET_CNI_BIN_DIRS", func(c *Config) any { return &c.CNIBinDirs }},
		{"podCIDR", "pod-cidr", "MQLET_POD_CIDR", func(c *Config) any { return &c.PodCIDR }},
		{"clusterDNS", "cluster-dns", "MQLET_CLUSTER_DNS", func(c *Config) any { return &c.ClusterDNS }},
		{"clusterDomain", "cluster-domain", "MQLET_CLUSTER_DOMAIN", func(c *Config) any { return &c.ClusterDomain }},
		{"resolvConf", "resolv-conf", "MQLET_RESOLV_CONF", func(c *Config) any { return &c.ResolvConf }},
		{"containerLogMaxSize", "container-log-max-size", "MQLET_CONTAINER_LOG_MAX_SIZE", func(c *Config) any { return &c.ContainerLogMaxSize }},
		{"containerLogMaxFiles", "container-log-max-files", "MQLET_CONTAINER_LOG_MAX_FILES", func(c *Config) any { return &c.ContainerLogMaxFiles }},
		{"allowedUnsafeSysctls", "allowed-unsafe-sysctl", "MQLET_ALLOWED_UNSAFE_SYSCTLS", func(c *Config) any { return &c.AllowedUnsafeSysctls }},
		{"registryAuthFile", "registry-auth-file", "MQLET_REGISTRY_AUTH_FILE", func(c *Config) any { return &c.RegistryAuthFile }},
	}
}

// isGroup reports whether key names a mapping of settings in the config file (mqttPolicy).
func isGroup(key string) bool {
	for _, s := range settings() {
		if strings.HasPrefix(s.key, key+".") {
			return true
		}
	}
	return false
}

const (
	envPrefix     = "MQLET_"
	envConfig     = "MQLET_CONFIG"
	envTestPrefix = "MQLET_TEST_"
)

// Load builds the effective config: Defaults, then the YAML file (f.Config, or MQLET_CONFIG from
// environ when the flag is empty), then MQLET_* variables from environ, then the flags that were
// given; then it validates. Every problem found is reported, joined into one error, so that a
// broken unit file is fixed in one round trip instead of one error per restart.
func Load(f Flags, environ []string) (Config, error) {
	c := Defaults()
	origin := map[string]string{} // YAML key -> where its current value came from
	env := parseEnviron(environ)
	var errs []error

	path := f.Config
	if path == "" {
		path = env[envConfig]
	}
	if path != "" {
		errs = append(errs, applyFile(&c, origin, path)...)
	}
	errs = append(errs, applyEnv(&c, origin, env)...)
	errs = append(errs, applyFlags(&c, origin, f)...)

	for _, fe := range c.validate() {
		fe.Origin = origin[fe.Key]
		errs = append(errs, fe)
	}
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	return c, nil
}

// parseEnviron turns os.Environ-style entries into a map; the first entry for a name wins, as
// with os.Getenv.
func parseEnviron(environ []string) map[string]string {
	env := make(map[string]string, len(environ))
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		if _, seen := env[name]; !seen {
			env[name] = value
		}
	}
	return env
}

func applyFile(c *Config, origin map[string]string, path string) []error {
	data, err := os.ReadFile(path)
	if err != nil {
		return []error{fmt.Errorf("config file (--config): %w", err)}
	}
	// Strict conversion rejects duplicate keys, which otherwise silently keep the last one.
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return []error{fmt.Errorf("config file %s: %w", path, err)}
	}
	if string(js) == "null" { // empty or comments-only file
		return nil
	}
	// Decoding key by key, rather than into Config at once, lets each error name its key
	// (encoding/json drops the field name from errors returned by UnmarshalJSON) and
	// matches keys exactly (encoding/json would accept "statedir" for "stateDir").
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(js, &doc); err != nil {
		return []error{fmt.Errorf("config file %s: top level must be a mapping of settings: %w", path, err)}
	}
	return applyMapping(c, origin, path, "", doc)
}

// applyMapping sets the settings of one mapping of the config file; prefix is "" at the top level
// and "group." inside a group such as mqttPolicy, so every key is named in full in errors.
func applyMapping(c *Config, origin map[string]string, path, prefix string, doc map[string]json.RawMessage) []error {
	byKey := map[string]setting{}
	for _, s := range settings() {
		byKey[s.key] = s
	}
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(doc)) {
		full := prefix + k
		if string(doc[k]) == "null" {
			if _, ok := byKey[full]; ok || isGroup(full) {
				continue // "key:" with no value leaves the setting unset, as in Kubernetes objects
			}
		}
		s, ok := byKey[full]
		if !ok && isGroup(full) {
			var sub map[string]json.RawMessage
			if doc[k][0] != '{' || json.Unmarshal(doc[k], &sub) != nil {
				errs = append(errs, fmt.Errorf("config file %s: key %s: got %s, want a mapping of settings", path, full, describeJSON(doc[k])))
				continue
			}
			errs = append(errs, applyMapping(c, origin, path, full+".", sub)...)
			continue
		}
		if !ok {
			errs = append(errs, fmt.Errorf("config file %s: unknown key %q%s", path, full, suggestKey(full)))
			continue
		}
		if err := decodeJSONValue(doc[k], s.field(c)); err != nil {
			errs = append(errs, fmt.Errorf("config file %s: key %s: %w", path, full, err))
			continue
		}
		origin[full] = "config file " + path
	}
	return errs
}

// decodeJSONValue decodes one value into a temporary so a bad value leaves the field untouched.
func decodeJSONValue(raw json.RawMessage, dst any) error {
	switch p := dst.(type) {
	case *string:
		var v string
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("got %s, want a string%s", describeJSON(raw), quoteHint(raw))
		}
		*p = v
	case *bool:
		var v bool
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("got %s, want true or false", describeJSON(raw))
		}
		*p = v
	case *Duration:
		var v Duration
		if err := json.Unmarshal(raw, &v); err != nil {
			return err
		}
		*p = v
	case *int64:
		var v int64
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("got %s, want a whole number", describeJSON(raw))
		}
		*p = v
	case *map[string]string:
		// Values may be written as YAML numbers (maxPods-like counts, "pid: 1000"): kept as text.
		var m map[string]json.RawMessage
		if raw[0] != '{' || json.Unmarshal(raw, &m) != nil {
			return fmt.Errorf("got %s, want a mapping of names to values", describeJSON(raw))
		}
		v := make(map[string]string, len(m))
		for k, r := range m {
			var str string
			switch {
			case json.Unmarshal(r, &str) == nil:
			case r[0] >= '0' && r[0] <= '9' || r[0] == '-':
				str = string(r)
			default:
				return fmt.Errorf("%s: got %s, want a string or a number", k, describeJSON(r))
			}
			v[k] = str
		}
		if len(v) == 0 {
			v = nil // "{}" and an absent key mean the same
		}
		*p = v
	case *[]string:
		var v []string
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("got %s, want a list of strings", describeJSON(raw))
		}
		if len(v) == 0 {
			v = nil // "[]" and an absent key mean the same
		}
		*p = v
	default:
		panic(fmt.Sprintf("config: no decoder for %T", dst))
	}
	return nil
}

// describeJSON names the YAML type of a value converted to JSON, for type-mismatch messages.
func describeJSON(raw json.RawMessage) string {
	kind := "a number"
	switch raw[0] {
	case '"':
		kind = "a string"
	case 't', 'f':
		kind = "a bool"
	case '[':
		kind = "a list"
	case '{':
		kind = "a mapping"
	}
	return fmt.Sprintf("%s (%s)", kind, raw)
}

// quoteHint explains the classic YAML trap: unquoted yes/no/on/off are booleans and 0755 or
// 1e3 are numbers, so a string setting needs quotes.
func quoteHint(raw json.RawMessage) string {
	switch raw[0] {
	case '"', '[', '{':
		return ""
	}
	return "; quote the value in YAML"
}

func suggestKey(k string) string {
	for _, s := range settings() {
		names := []string{s.key}
		if group, _, ok := strings.Cut(s.key, "."); ok {
			names = append(names, group)
		}
		for _, name := range names {
			if strings.EqualFold(name, k) {
				return fmt.Sprintf(" (did you mean %q? keys are case-sensitive)", name)
			}
		}
	}
	return ""
}

func applyEnv(c *Config, origin map[string]string, env map[string]string) []error {
	byEnv := map[string]setting{}
	for _, s := range settings() {
		byEnv[s.env] = s
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(env)) {
		if !strings.HasPrefix(name, envPrefix) || name == envConfig || strings.HasPrefix(name, envTestPrefix) {
			continue
		}
		s, ok := byEnv[name]
		if !ok {
			// A typo in a unit file's Environment= would otherwise be ignored without a trace.
			errs = append(errs, fmt.Errorf("unknown environment variable %s (MQLET_* variables are reserved for settings; see mqlet agent --help)", name))
			continue
		}
		if err := setFromString(s.field(c), env[name]); err != nil {
			errs = append(errs, fmt.Errorf("environment variable %s=%q (%s, --%s): %w", name, env[name], s.key, s.flag, err))
			continue
		}
		origin[s.key] = "environment variable " + name
	}
	return errs
}

func setFromString(dst any, s string) error {
	switch p := dst.(type) {
	case *string:
		*p = s
	case *bool:
		v, err := strconv.ParseBool(s)
		if err != nil {
			return errors.New("not a bool: want true or false")
		}
		*p = v
	case *Duration:
		v, err := parseDuration(s)
		if err != nil {
			return err
		}
		p.Duration = v
	case *int64:
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return errors.New("not a whole number")
		}
		*p = v
	case *[]string:
		*p = splitList(s)
	case *map[string]string:
		m, err := parsePairs(splitList(s))
		if err != nil {
			return err
		}
		*p = m
	default:
		panic(fmt.Sprintf("config: no parser for %T", dst))
	}
	return nil
}

// splitList splits a comma-separated list, dropping blanks so "a, b," means [a b].
func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

func applyFlags(c *Config, origin map[string]string, f Flags) (flagErrs []error) {
	str := func(dst *string, v *string, key, flag string) {
		if v != nil {
			*dst = *v
			origin[key] = "flag --" + flag
		}
	}
	dur := func(dst *Duration, v *time.Duration, key, flag string) {
		if v != nil {
			dst.Duration = *v
			origin[key] = "flag --" + flag
		}
	}
	num := func(dst *int64, v *int64, key, flag string) {
		if v != nil {
			*dst = *v
			origin[key] = "flag --" + flag
		}
	}
	boolean := func(dst *bool, v *bool, key, flag string) {
		if v != nil {
			*dst = *v
			origin[key] = "flag --" + flag
		}
	}
	// Repeated list flags replace the list from the file/env rather than extend it, so the
	// command line alone shows the whole effective list.
	list := func(dst *[]string, v []string, key, flag string) {
		if v != nil {
			*dst = nil
			for _, x := range v {
				*dst = append(*dst, splitList(x)...)
			}
			origin[key] = "flag --" + flag
		}
	}
	str(&c.NodeName, f.NodeName, "nodeName", "node-name")
	str(&c.StateDir, f.StateDir, "stateDir", "state-dir")
	str(&c.ContainerdAddress, f.ContainerdAddress, "containerdAddress", "containerd-address")
	str(&c.ContainerdNamespace, f.ContainerdNamespace, "containerdNamespace", "containerd-namespace")
	str(&c.ManifestDir, f.ManifestDir, "manifestDir", "manifest-dir")
	str(&c.ImagePreloadDir, f.ImagePreloadDir, "imagePreloadDir", "image-preload-dir")
	str(&c.APISocket, f.APISocket, "apiSocket", "api-socket")
	str(&c.LogLevel, f.LogLevel, "logLevel", "log-level")
	str(&c.LogFormat, f.LogFormat, "logFormat", "log-format")
	boolean(&c.Once, f.Once, "once", "once")
	dur(&c.OnceTimeout, f.OnceTimeout, "onceTimeout", "once-timeout")
	dur(&c.RelistPeriod, f.RelistPeriod, "relistPeriod", "relist-period")
	dur(&c.ContainerdTimeout, f.ContainerdTimeout, "containerdTimeout", "containerd-timeout")
	list(&c.PlainHTTPRegistries, f.PlainHTTPRegistries, "plainHTTPRegistries", "plain-http-registry")
	str(&c.RegistryCAFile, f.RegistryCAFile, "registryCAFile", "registry-ca-file")
	str(&c.MQTTBroker, f.MQTTBroker, "mqttBroker", "mqtt-broker")
	str(&c.MQTTCAFile, f.MQTTCAFile, "mqttCAFile", "mqtt-ca-file")
	str(&c.MQTTCertFile, f.MQTTCertFile, "mqttCertFile", "mqtt-cert-file")
	str(&c.MQTTKeyFile, f.MQTTKeyFile, "mqttKeyFile", "mqtt-key-file")
	str(&c.MQTTUsername, f.MQTTUsername, "mqttUsername", "mqtt-username")
	str(&c.MQTTPasswordFile, f.MQTTPasswordFile, "mqttPasswordFile", "mqtt-password-file")
	list(&c.MQTTTrustedKeys, f.MQTTTrustedKeys, "mqttTrustedKeys", "mqtt-trusted-key")
	dur(&c.MQTTKeepalive, f.MQTTKeepalive, "mqttKeepalive", "mqtt-keepalive")
	str(&c.MQTTTopicPrefix, f.MQTTTopicPrefix, "mqttTopicPrefix", "mqtt-topic-prefix")
	dur(&c.MQTTReconnectMax, f.MQTTReconnectMax, "mqttReconnectMax", "mqtt-reconnect-max")
	num(&c.MQTTMaxPayload, f.MQTTMaxPayload, "mqttMaxPayload", "mqtt-max-payload")
	num(&c.OutboxMaxBytes, f.OutboxMaxBytes, "outboxMaxBytes", "outbox-max-bytes")
	str(&c.SecretKeyFile, f.SecretKeyFile, "secretKeyFile", "secret-key-file")
	pairs := func(dst *map[string]string, v []string, key, flag string) {
		if v != nil {
			var items []string
			for _, x := range v {
				items = append(items, splitList(x)...)
			}
			m, err := parsePairs(items)
			if err != nil {
				flagErrs = append(flagErrs, fmt.Errorf("flag --%s: %w", flag, err))
				return
			}
			*dst = m
			origin[key] = "flag --" + flag
		}
	}
	dur(&c.NodeStatusUpdateFrequency, f.NodeStatusUpdateFrequency, "nodeStatusUpdateFrequency", "node-status-update-frequency")
	num(&c.NodeStatusMaxImages, f.NodeStatusMaxImages, "nodeStatusMaxImages", "node-status-max-images")
	pairs(&c.NodeLabels, f.NodeLabels, "nodeLabels", "node-label")
	list(&c.NodeTaints, f.NodeTaints, "nodeTaints", "node-taint")
	num(&c.MaxPods, f.MaxPods, "maxPods", "max-pods")
	str(&c.ImageFSDir, f.ImageFSDir, "imageFSDir", "image-fs-dir")
	str(&c.CgroupRoot, f.CgroupRoot, "cgroupRoot", "cgroup-root")
	boolean(&c.EnforceNodeAllocatable, f.EnforceNodeAllocatable, "enforceNodeAllocatable", "enforce-node-allocatable")
	pairs(&c.SystemReserved, f.SystemReserved, "systemReserved", "system-reserved")
	pairs(&c.AgentReserved, f.AgentReserved, "agentReserved", "agent-reserved")
	num(&c.PodPidsLimit, f.PodPidsLimit, "podPidsLimit", "pod-pids-limit")
	boolean(&c.SingleProcessOOMKill, f.SingleProcessOOMKill, "singleProcessOOMKill", "single-process-oom-kill")
	pairs(&c.EvictionHard, f.EvictionHard, "evictionHard", "eviction-hard")
	pairs(&c.EvictionSoft, f.EvictionSoft, "evictionSoft", "eviction-soft")
	pairs(&c.EvictionSoftGracePeriod, f.EvictionSoftGracePeriod, "evictionSoftGracePeriod", "eviction-soft-grace-period")
	pairs(&c.EvictionMinimumReclaim, f.EvictionMinimumReclaim, "evictionMinimumReclaim", "eviction-minimum-reclaim")
	dur(&c.EvictionPressureTransitionPeriod, f.EvictionPressureTransitionPeriod, "evictionPressureTransitionPeriod", "eviction-pressure-transition-period")
	dur(&c.EvictionMaxPodGracePeriod, f.EvictionMaxPodGracePeriod, "evictionMaxPodGracePeriod", "eviction-max-pod-grace-period")
	dur(&c.EvictionMonitoringPeriod, f.EvictionMonitoringPeriod, "evictionMonitoringPeriod", "eviction-monitoring-period")
	num(&c.ImageGCHighThresholdPercent, f.ImageGCHighThresholdPercent, "imageGCHighThresholdPercent", "image-gc-high-threshold")
	num(&c.ImageGCLowThresholdPercent, f.ImageGCLowThresholdPercent, "imageGCLowThresholdPercent", "image-gc-low-threshold")
	dur(&c.ImageMinimumGCAge, f.ImageMinimumGCAge, "imageMinimumGCAge", "image-minimum-gc-age")
	// Device globs may hold commas only in theory; each --device is one entry.
	if f.Devices != nil {
		c.Devices = append([]string(nil), f.Devices...)
		origin["devices"] = "flag --device"
	}
	dur(&c.ShutdownGracePeriod, f.ShutdownGracePeriod, "shutdownGracePeriod", "shutdown-grace-period")
	dur(&c.ShutdownGracePeriodCriticalPods, f.ShutdownGracePeriodCriticalPods, "shutdownGracePeriodCriticalPods", "shutdown-grace-period-critical-pods")
	str(&c.ShutdownSignal, f.ShutdownSignal, "shutdownSignal", "shutdown-signal")
	str(&c.MetricsAddress, f.MetricsAddress, "metricsAddress", "metrics-address")
	str(&c.CNIConfDir, f.CNIConfDir, "cniConfDir", "cni-conf-dir")
	list(&c.CNIBinDirs, f.CNIBinDirs, "cniBinDirs", "cni-bin-dir")
	str(&c.PodCIDR, f.PodCIDR, "podCIDR", "pod-cidr")
	list(&c.ClusterDNS, f.ClusterDNS, "clusterDNS", "cluster-dns")
	str(&c.ClusterDomain, f.ClusterDomain, "clusterDomain", "cluster-domain")
	str(&c.ResolvConf, f.ResolvConf, "resolvConf", "resolv-conf")
	str(&c.ContainerLogMaxSize, f.ContainerLogMaxSize, "containerLogMaxSize", "container-log-max-size")
	num(&c.ContainerLogMaxFiles, f.ContainerLogMaxFiles, "containerLogMaxFiles", "container-log-max-files")
	list(&c.AllowedUnsafeSysctls, f.AllowedUnsafeSysctls, "allowedUnsafeSysctls", "allowed-unsafe-sysctl")
	str(&c.RegistryAuthFile, f.RegistryAuthFile, "registryAuthFile", "registry-auth-file")
	boolean(&c.MQTTPolicy.AllowPrivileged, f.MQTTAllowPrivileged, "mqttPolicy.allowPrivileged", "mqtt-allow-privileged")
	boolean(&c.MQTTPolicy.AllowHostNamespaces, f.MQTTAllowHostNamespaces, "mqttPolicy.allowHostNamespaces", "mqtt-allow-host-namespaces")
	list(&c.MQTTPolicy.AllowedHostPaths, f.MQTTAllowedHostPaths, "mqttPolicy.allowedHostPaths", "mqtt-allowed-host-path")
	return flagErrs
}
