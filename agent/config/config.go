// Package config holds the settings of `mqlet agent`: their defaults, the YAML config file, the
// MQLET_* environment variables and the command-line flags, merged in that order of precedence
// and validated as a whole before the agent touches anything, the way kubelet validates its
// KubeletConfiguration at start.
package config

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/mqlet/mqlet/agent/eviction"
	"github.com/mqlet/mqlet/store"
)

// Config is the effective configuration of the agent, and the one declaration of every setting:
// each field's tags give its YAML key (json: sigs.k8s.io/yaml goes through JSON), its flag, its
// environment variable, the flag's placeholder and help; its default is in Defaults. settings()
// reads them, Load applies file, environment and flags from them, and the kong Flags of
// `mqlet agent` are generated from them (flags.go, TestFlagsGenerated). A field without a flag tag
// is a group of settings (a mapping in the file); flagfield prefixes its settings' Flags names.
type Config struct {
	NodeName            string   `json:"nodeName" flag:"node-name" env:"MQLET_NODE_NAME" placeholder:"NAME" defaulttext:"the hostname, lowercased" help:"Name of this node, a DNS-1123 subdomain"`
	StateDir            string   `json:"stateDir" flag:"state-dir" env:"MQLET_STATE_DIR" placeholder:"DIR" help:"Directory for the state database and container logs"`
	ContainerdAddress   string   `json:"containerdAddress" flag:"containerd-address" env:"MQLET_CONTAINERD_ADDRESS" placeholder:"SOCKET" help:"containerd socket, a path or unix://path"`
	ContainerdNamespace string   `json:"containerdNamespace" flag:"containerd-namespace" env:"MQLET_CONTAINERD_NAMESPACE" placeholder:"NS" help:"containerd namespace that holds mqlet's containers and images"`
	ManifestDir         string   `json:"manifestDir" flag:"manifest-dir" env:"MQLET_MANIFEST_DIR" placeholder:"DIR" help:"Directory of static pod manifests"`
	ImagePreloadDir     string   `json:"imagePreloadDir" flag:"image-preload-dir" env:"MQLET_IMAGE_PRELOAD_DIR" placeholder:"DIR" help:"Image archives imported at start when not already present"`
	APISocket           string   `json:"apiSocket" flag:"api-socket" env:"MQLET_API_SOCKET" placeholder:"SOCKET" help:"Unix socket of the local API used by the mqlet CLI"`
	LogLevel            string   `json:"logLevel" flag:"log-level" env:"MQLET_LOG_LEVEL" placeholder:"LEVEL" help:"Log level: debug, info, warn or error"`
	LogFormat           string   `json:"logFormat" flag:"log-format" env:"MQLET_LOG_FORMAT" placeholder:"FORMAT" help:"Log format: text or json"`
	Once                bool     `json:"once" flag:"once" env:"MQLET_ONCE" help:"Start the pods once, wait for them to run or finish, then exit"`
	OnceTimeout         Duration `json:"onceTimeout" flag:"once-timeout" env:"MQLET_ONCE_TIMEOUT" placeholder:"DURATION" help:"How long --once waits for the pods"`
	RelistPeriod        Duration `json:"relistPeriod" flag:"relist-period" env:"MQLET_RELIST_PERIOD" placeholder:"DURATION" help:"Period of the containerd relist that catches missed events, at least 1s"`
	ContainerdTimeout   Duration `json:"containerdTimeout" flag:"containerd-timeout" env:"MQLET_CONTAINERD_TIMEOUT" placeholder:"DURATION" help:"Timeout for connecting to containerd"`
	PlainHTTPRegistries []string `json:"plainHTTPRegistries" flag:"plain-http-registry" env:"MQLET_PLAIN_HTTP_REGISTRIES" placeholder:"HOST[:PORT]" help:"Registry pulled over plain HTTP instead of TLS; repeatable or comma-separated"`
	RegistryCAFile      string   `json:"registryCAFile" flag:"registry-ca-file" env:"MQLET_REGISTRY_CA_FILE" placeholder:"FILE" help:"Extra CA bundle (PEM) trusted for TLS registries"`

	// MQTT sync channel. An empty MQTTBroker means standalone: the manifest dir is the only source
	// and nothing is reported.
	MQTTBroker   string `json:"mqttBroker" flag:"mqtt-broker" env:"MQLET_MQTT_BROKER" placeholder:"URL" help:"MQTT broker, scheme://host:port with scheme tcp, ssl, tls, ws or wss (mqtt means tcp, mqtts ssl); empty runs standalone with the manifest dir as the only source"`
	MQTTCAFile   string `json:"mqttCAFile" flag:"mqtt-ca-file" env:"MQLET_MQTT_CA_FILE" placeholder:"FILE" help:"CA bundle (PEM) for the broker's certificate, instead of the system roots; ssl, tls and wss brokers only"`
	MQTTCertFile string `json:"mqttCertFile" flag:"mqtt-cert-file" env:"MQLET_MQTT_CERT_FILE" placeholder:"FILE" help:"Client certificate (PEM) for brokers that authenticate nodes by TLS; needs --mqtt-key-file"`
	MQTTKeyFile  string `json:"mqttKeyFile" flag:"mqtt-key-file" env:"MQLET_MQTT_KEY_FILE" placeholder:"FILE" help:"Private key (PEM) of --mqtt-cert-file, readable by its owner only (chmod 600: a key others can read is refused)"`
	MQTTUsername string `json:"mqttUsername" flag:"mqtt-username" env:"MQLET_MQTT_USERNAME" placeholder:"NAME" help:"MQTT user name"`
	// MQTTTrustedKeys are public key files (PEM, Ed25519, from `mqlet ctl keygen`): with any, the
	// node applies only desired state whose index one of them signed. Several allow a rotation.
	MQTTTrustedKeys  []string `json:"mqttTrustedKeys" flag:"mqtt-trusted-key" env:"MQLET_MQTT_TRUSTED_KEY" placeholder:"FILE" help:"Public key (PEM, from mqlet ctl keygen) whose signature desired state must carry; repeatable for a key rotation; without any, every index on the broker is taken, with a warning"`
	MQTTPasswordFile string   `json:"mqttPasswordFile" flag:"mqtt-password-file" env:"MQLET_MQTT_PASSWORD_FILE" placeholder:"FILE" help:"File holding the MQTT password, readable by its owner only (chmod 600); the password is never logged"`
	MQTTKeepalive    Duration `json:"mqttKeepalive" flag:"mqtt-keepalive" env:"MQLET_MQTT_KEEPALIVE" placeholder:"DURATION" help:"MQTT keepalive in whole seconds, 5s to 65535s; the broker declares the node offline after 1.5 times this without traffic"`
	MQTTTopicPrefix  string   `json:"mqttTopicPrefix" flag:"mqtt-topic-prefix" env:"MQLET_MQTT_TOPIC_PREFIX" placeholder:"PREFIX" help:"First levels of every MQTT topic: PREFIX/nodes/NODE/..."`
	MQTTReconnectMax Duration `json:"mqttReconnectMax" flag:"mqtt-reconnect-max" env:"MQLET_MQTT_RECONNECT_MAX" placeholder:"DURATION" help:"Longest wait between attempts to reach the broker, at least 1s"`
	MQTTMaxPayload   int64    `json:"mqttMaxPayload" flag:"mqtt-max-payload" env:"MQLET_MQTT_MAX_PAYLOAD" placeholder:"BYTES" help:"Largest MQTT message sent or accepted, 1024 to 268435455 bytes"`
	// OutboxMaxBytes bounds the reports queued in the state store while the broker is unreachable.
	OutboxMaxBytes int64 `json:"outboxMaxBytes" flag:"outbox-max-bytes" env:"MQLET_OUTBOX_MAX_BYTES" placeholder:"BYTES" help:"Most bytes of reports kept for the broker while it is unreachable, at least 65536"`
	// SecretKeyFile is the node key that seals secrets in the state store. It lives outside
	// StateDir, so a copy of the state dir (a backup, a cloned SD card) does not carry its own key.
	SecretKeyFile string `json:"secretKeyFile" flag:"secret-key-file" env:"MQLET_SECRET_KEY_FILE" placeholder:"FILE" help:"Node key that seals secrets in the state store; must lie outside --state-dir"`

	// Node status (see policy.go for what each means and how it is checked).
	NodeStatusUpdateFrequency Duration          `json:"nodeStatusUpdateFrequency" flag:"node-status-update-frequency" env:"MQLET_NODE_STATUS_UPDATE_FREQUENCY" placeholder:"DURATION" help:"How often the node status is computed; it is reported only when it changes"`
	NodeStatusMaxImages       int64             `json:"nodeStatusMaxImages" flag:"node-status-max-images" env:"MQLET_NODE_STATUS_MAX_IMAGES" placeholder:"N" help:"Most images listed in the node status, largest first; 0 lists none"`
	NodeLabels                map[string]string `json:"nodeLabels" flag:"node-label" env:"MQLET_NODE_LABELS" placeholder:"KEY=VALUE" help:"Label of the node; repeatable or comma-separated"`
	NodeTaints                []string          `json:"nodeTaints" flag:"node-taint" env:"MQLET_NODE_TAINTS" placeholder:"KEY[=VALUE]:EFFECT" help:"Taint of the node, EFFECT one of NoSchedule, PreferNoSchedule, NoExecute; repeatable or comma-separated"`
	MaxPods                   int64             `json:"maxPods" flag:"max-pods" env:"MQLET_MAX_PODS" placeholder:"N" help:"Most pods this node runs"`
	ImageFSDir                string            `json:"imageFSDir" flag:"image-fs-dir" env:"MQLET_IMAGE_FS_DIR" placeholder:"DIR" help:"containerd's root directory, whose file system holds images: the imagefs of eviction and image GC"`

	// Pod and QoS cgroups, node allocatable.
	// CgroupDriver says who makes the top of the pods' tree: cgroupfs (mqlet, at the hierarchy's
	// root), systemd (a transient scope delegated to mqlet, see agent/cgroup/delegate), or auto
	// (systemd on a cgroup v2 host booted by systemd, unless pods already run in a cgroupfs tree).
	CgroupDriver           string            `json:"cgroupDriver" flag:"cgroup-driver" env:"MQLET_CGROUP_DRIVER" placeholder:"DRIVER" help:"Who makes the top of the pods' cgroup tree: auto, systemd (a delegated scope, mqlet.slice/mqlet-pods.scope) or cgroupfs (the hierarchy's root)"`
	CgroupRoot             string            `json:"cgroupRoot" flag:"cgroup-root" env:"MQLET_CGROUP_ROOT" placeholder:"PATH" help:"cgroup under which pods run: PATH/NAMESPACE/{burstable,besteffort}/pod<uid>"`
	EnforceNodeAllocatable bool              `json:"enforceNodeAllocatable" flag:"enforce-node-allocatable" env:"MQLET_ENFORCE_NODE_ALLOCATABLE" help:"Limit all pods together to node allocatable on the cgroup above them"`
	SystemReserved         map[string]string `json:"systemReserved" flag:"system-reserved" env:"MQLET_SYSTEM_RESERVED" placeholder:"RES=QTY" help:"Resources kept for the OS, e.g. cpu=200m,memory=150Mi,ephemeral-storage=1Gi,pid=1000"`
	AgentReserved          map[string]string `json:"agentReserved" flag:"agent-reserved" env:"MQLET_AGENT_RESERVED" placeholder:"RES=QTY" help:"Resources kept for mqlet and containerd, as --system-reserved"`
	// PodPidsLimit is kubelet's podPidsLimit: pids.max of each pod's cgroup; -1 (or 0) for none.
	PodPidsLimit int64 `json:"podPidsLimit" flag:"pod-pids-limit" env:"MQLET_POD_PIDS_LIMIT" placeholder:"N" help:"Most processes (pids.max) one pod may have; -1 for no limit"`
	// SingleProcessOOMKill is kubelet's singleProcessOOMKill: on cgroup v2, false (the default)
	// sets memory.oom.group=1 on every container, so an OOM kill ends the whole container.
	SingleProcessOOMKill bool `json:"singleProcessOOMKill" flag:"single-process-oom-kill" env:"MQLET_SINGLE_PROCESS_OOM_KILL" help:"cgroup v2: let the kernel's OOM killer end one process of a container rather than all of it (memory.oom.group=0)"`

	// Eviction, kubelet's settings under kubelet's names.
	EvictionHard                     map[string]string `json:"evictionHard" flag:"eviction-hard" env:"MQLET_EVICTION_HARD" placeholder:"SIGNAL<VALUE" help:"Hard eviction thresholds, e.g. memory.available<100Mi,nodefs.available<10%; replaces the defaults"`
	EvictionSoft                     map[string]string `json:"evictionSoft" flag:"eviction-soft" env:"MQLET_EVICTION_SOFT" placeholder:"SIGNAL<VALUE" help:"Soft eviction thresholds; each needs --eviction-soft-grace-period"`
	EvictionSoftGracePeriod          map[string]string `json:"evictionSoftGracePeriod" flag:"eviction-soft-grace-period" env:"MQLET_EVICTION_SOFT_GRACE_PERIOD" placeholder:"SIGNAL=DURATION" help:"How long a soft threshold must hold before it evicts"`
	EvictionMinimumReclaim           map[string]string `json:"evictionMinimumReclaim" flag:"eviction-minimum-reclaim" env:"MQLET_EVICTION_MINIMUM_RECLAIM" placeholder:"SIGNAL=VALUE" help:"Reclaim this much beyond a crossed threshold"`
	EvictionPressureTransitionPeriod Duration          `json:"evictionPressureTransitionPeriod" flag:"eviction-pressure-transition-period" env:"MQLET_EVICTION_PRESSURE_TRANSITION_PERIOD" placeholder:"DURATION" help:"How long a pressure condition stays after its threshold is no longer crossed"`
	EvictionMaxPodGracePeriod        Duration          `json:"evictionMaxPodGracePeriod" flag:"eviction-max-pod-grace-period" env:"MQLET_EVICTION_MAX_POD_GRACE_PERIOD" placeholder:"DURATION" help:"Longest grace period a pod evicted by a soft threshold gets; 0 uses the pod's own, where kubelet's 0 stops the pod at once"`
	EvictionMonitoringPeriod         Duration          `json:"evictionMonitoringPeriod" flag:"eviction-monitoring-period" env:"MQLET_EVICTION_MONITORING_PERIOD" placeholder:"DURATION" help:"How often eviction signals are read; memory is also re-checked on kernel notification where available"`

	// Image garbage collection.
	ImageGCHighThresholdPercent int64    `json:"imageGCHighThresholdPercent" flag:"image-gc-high-threshold" env:"MQLET_IMAGE_GC_HIGH_THRESHOLD" placeholder:"PERCENT" help:"Image file system usage that starts image garbage collection"`
	ImageGCLowThresholdPercent  int64    `json:"imageGCLowThresholdPercent" flag:"image-gc-low-threshold" env:"MQLET_IMAGE_GC_LOW_THRESHOLD" placeholder:"PERCENT" help:"Usage image garbage collection brings the image file system down to"`
	ImageMinimumGCAge           Duration `json:"imageMinimumGCAge" flag:"image-minimum-gc-age" env:"MQLET_IMAGE_MINIMUM_GC_AGE" placeholder:"DURATION" help:"Minimum age of an unused image before it may be removed"`

	// Devices maps a resource name to host device nodes, one "NAME=GLOB[:SHARE]" per entry; several
	// entries may name the same resource (see DeviceResources).
	Devices []string `json:"devices" flag:"device" env:"MQLET_DEVICES" placeholder:"NAME=GLOB[:SHARE]" split:"false" help:"Host devices offered as a resource, e.g. mqlet.io/serial=/dev/ttyUSB*; SHARE pods may share one device (default 1); repeatable"`

	// Graceful node shutdown.
	ShutdownGracePeriod             Duration `json:"shutdownGracePeriod" flag:"shutdown-grace-period" env:"MQLET_SHUTDOWN_GRACE_PERIOD" placeholder:"DURATION" help:"Time pods get to stop when the system shuts down; 0 turns graceful node shutdown off"`
	ShutdownGracePeriodCriticalPods Duration `json:"shutdownGracePeriodCriticalPods" flag:"shutdown-grace-period-critical-pods" env:"MQLET_SHUTDOWN_GRACE_PERIOD_CRITICAL_PODS" placeholder:"DURATION" help:"Part of --shutdown-grace-period kept for critical pods, which stop last"`
	ShutdownSignal                  string   `json:"shutdownSignal" flag:"shutdown-signal" env:"MQLET_SHUTDOWN_SIGNAL" placeholder:"SIGNAL" help:"Signal that announces a system shutdown where systemd-logind is absent; empty for none"`

	// MetricsAddress serves /metrics, /healthz and /readyz over TCP too; empty: the API socket only.
	// A host without a port listens on DefaultMetricsPort (see MetricsListenAddress).
	MetricsAddress string `json:"metricsAddress" flag:"metrics-address" env:"MQLET_METRICS_ADDRESS" placeholder:"HOST[:PORT]" help:"Also serve /metrics, /healthz and /readyz over TCP here; a host alone listens on port 10264"`

	// Pod networking through CNI, and pod DNS (see pods.go).
	CNIConfDir    string   `json:"cniConfDir" flag:"cni-conf-dir" env:"MQLET_CNI_CONF_DIR" placeholder:"DIR" help:"CNI network configurations; when it holds none, mqlet writes its own bridge network there"`
	CNIBinDirs    []string `json:"cniBinDirs" flag:"cni-bin-dir" env:"MQLET_CNI_BIN_DIRS" placeholder:"DIR" help:"Directories searched for CNI plugin binaries, in order; repeatable or comma-separated"`
	PodCIDR       string   `json:"podCIDR" flag:"pod-cidr" env:"MQLET_POD_CIDR" placeholder:"CIDR" help:"Pod addresses of the default CNI network mqlet writes"`
	ClusterDNS    []string `json:"clusterDNS" flag:"cluster-dns" env:"MQLET_CLUSTER_DNS" placeholder:"IP" help:"DNS servers of ClusterFirst pods; with none, ClusterFirst falls back to Default as kubelet does; repeatable or comma-separated"`
	ClusterDomain string   `json:"clusterDomain" flag:"cluster-domain" env:"MQLET_CLUSTER_DOMAIN" placeholder:"DOMAIN" help:"Cluster domain for the search list of ClusterFirst pods"`
	ResolvConf    string   `json:"resolvConf" flag:"resolv-conf" env:"MQLET_RESOLV_CONF" placeholder:"FILE" help:"Resolver file that Default-policy pods inherit; empty for none"`

	// Pod semantics: container log rotation, sysctls, node-wide registry credentials.
	ContainerLogMaxSize  string   `json:"containerLogMaxSize" flag:"container-log-max-size" env:"MQLET_CONTAINER_LOG_MAX_SIZE" placeholder:"QTY" help:"Size at which a container log file is rotated, e.g. 10Mi"`
	ContainerLogMaxFiles int64    `json:"containerLogMaxFiles" flag:"container-log-max-files" env:"MQLET_CONTAINER_LOG_MAX_FILES" placeholder:"N" help:"Log files kept per container, the current one included, at least 2"`
	AllowedUnsafeSysctls []string `json:"allowedUnsafeSysctls" flag:"allowed-unsafe-sysctl" env:"MQLET_ALLOWED_UNSAFE_SYSCTLS" placeholder:"NAME" help:"Sysctl (or prefix ending in *) pods may set beyond the safe set; repeatable or comma-separated"`
	RegistryAuthFile     string   `json:"registryAuthFile" flag:"registry-auth-file" env:"MQLET_REGISTRY_AUTH_FILE" placeholder:"FILE" help:"Node-wide registry credentials, a docker config.json ({\"auths\": ...}), readable by its owner only"`

	// MQTTPolicy limits what pods from MQTT may ask of the node; manifest-dir pods are trusted.
	MQTTPolicy MQTTPolicy `json:"mqttPolicy" flagfield:"MQTT"`
}

// MQTTPolicy is the config file's mqttPolicy mapping; see admission.Policy for what each allows.
type MQTTPolicy struct {
	AllowPrivileged     bool     `json:"allowPrivileged" flag:"mqtt-allow-privileged" env:"MQLET_MQTT_ALLOW_PRIVILEGED" help:"Let pods from MQTT be privileged, escalate privileges or add capabilities beyond the baseline set"`
	AllowHostNamespaces bool     `json:"allowHostNamespaces" flag:"mqtt-allow-host-namespaces" env:"MQLET_MQTT_ALLOW_HOST_NAMESPACES" help:"Let pods from MQTT use hostNetwork, hostPID and hostIPC"`
	AllowDebugPtrace    bool     `json:"allowDebugPtrace" flag:"mqtt-allow-debug-ptrace" env:"MQLET_MQTT_ALLOW_DEBUG_PTRACE" help:"Let ephemeral containers from MQTT (kubectl debug) add SYS_PTRACE, as kubectl's default debug profile asks"`
	AllowedHostPaths    []string `json:"allowedHostPaths" flag:"mqtt-allowed-host-path" env:"MQLET_MQTT_ALLOWED_HOST_PATHS" placeholder:"DIR" help:"Host directory that pods from MQTT may mount as hostPath, with what lies below it, or a single file (/etc/hosts); repeatable or comma-separated"`
}

// Defaults returns the built-in settings. NodeName comes from the hostname, lowercased because
// node names must be DNS-1123 subdomains and many boards ship with names like "RaspberryPi";
// if the hostname cannot be read it is left empty and Validate asks for --node-name.
func Defaults() Config {
	host, _ := os.Hostname()
	return Config{
		NodeName:            strings.ToLower(host),
		StateDir:            "/var/lib/mqlet",
		ContainerdAddress:   "/run/containerd/containerd.sock",
		ContainerdNamespace: "mqlet",
		ManifestDir:         "/etc/mqlet/pods",
		ImagePreloadDir:     "/var/lib/mqlet/images",
		APISocket:           "/run/mqlet/mqlet.sock",
		LogLevel:            "info",
		LogFormat:           "text",
		Once:                false,
		OnceTimeout:         Duration{5 * time.Minute},
		RelistPeriod:        Duration{10 * time.Second},
		ContainerdTimeout:   Duration{10 * time.Second},
		PlainHTTPRegistries: nil,
		RegistryCAFile:      "",
		MQTTBroker:          "",
		MQTTKeepalive:       Duration{60 * time.Second},
		MQTTTopicPrefix:     "mqlet/v2",
		MQTTReconnectMax:    Duration{2 * time.Minute},
		MQTTMaxPayload:      1 << 20,
		OutboxMaxBytes:      1 << 20,
		SecretKeyFile:       "/etc/mqlet/node.key",
		MQTTPolicy:          MQTTPolicy{},

		NodeStatusUpdateFrequency: Duration{10 * time.Second},
		NodeStatusMaxImages:       50,
		MaxPods:                   110,
		ImageFSDir:                "/var/lib/containerd",
		CgroupDriver:              "auto",
		CgroupRoot:                "/mqlet",
		EnforceNodeAllocatable:    true,
		PodPidsLimit:              -1,

		EvictionHard:                     eviction.DefaultHard(),
		EvictionPressureTransitionPeriod: Duration{5 * time.Minute},
		EvictionMonitoringPeriod:         Duration{10 * time.Second},

		ImageGCHighThresholdPercent: 85,
		ImageGCLowThresholdPercent:  80,
		ImageMinimumGCAge:           Duration{2 * time.Minute},

		ShutdownGracePeriod:             Duration{30 * time.Second},
		ShutdownGracePeriodCriticalPods: Duration{10 * time.Second},
		ShutdownSignal:                  "SIGPWR",

		CNIConfDir:    "/etc/cni/net.d",
		CNIBinDirs:    []string{"/opt/cni/bin", "/usr/lib/cni"},
		PodCIDR:       "10.89.0.0/24",
		ClusterDomain: "cluster.local",
		ResolvConf:    "/etc/resolv.conf",

		ContainerLogMaxSize:  "10Mi",
		ContainerLogMaxFiles: 5,
	}
}

// DefaultMetricsPort is the TCP port of a metricsAddress that names only a host. Prometheus'
// exporter port range (9100-9999, listed on its "Default port allocations" wiki page) has been
// fully allocated since 2023, and its first port, 9100, is node_exporter's, which a Pi owner
// often runs beside mqlet; Kubernetes' node components take 10248-10259 (kubelet 10248, 10250,
// 10255; kube-proxy 10249, 10256). 10264 is in neither and no well-known exporter uses it.
const DefaultMetricsPort = 10264

// MetricsListenAddress is MetricsAddress with DefaultMetricsPort added when it names only a host
// ("127.0.0.1", "0.0.0.0", "[::1]"); empty when metrics are on the API socket only.
func (c Config) MetricsListenAddress() string {
	if c.MetricsAddress == "" {
		return ""
	}
	if _, _, err := net.SplitHostPort(c.MetricsAddress); err == nil {
		return c.MetricsAddress
	}
	return net.JoinHostPort(strings.TrimSuffix(strings.TrimPrefix(c.MetricsAddress, "["), "]"), strconv.Itoa(DefaultMetricsPort))
}

// StatePath is the bbolt database that holds desired pods, statuses and the outbox.
func (c Config) StatePath() string { return filepath.Join(c.StateDir, store.FileName) }

// ContainerdSocketPath is ContainerdAddress without an optional "unix://" prefix, which is what
// the containerd client dials.
func (c Config) ContainerdSocketPath() string {
	return strings.TrimPrefix(c.ContainerdAddress, "unix://")
}
