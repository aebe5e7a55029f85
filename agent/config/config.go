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

// Config is the effective configuration of the agent. The JSON tags are the YAML keys of the
// config file (sigs.k8s.io/yaml goes through JSON).
type Config struct {
	NodeName            string   `json:"nodeName"`
	StateDir            string   `json:"stateDir"`
	ContainerdAddress   string   `json:"containerdAddress"`
	ContainerdNamespace string   `json:"containerdNamespace"`
	ManifestDir         string   `json:"manifestDir"`
	ImagePreloadDir     string   `json:"imagePreloadDir"`
	APISocket           string   `json:"apiSocket"`
	LogLevel            string   `json:"logLevel"`
	LogFormat           string   `json:"logFormat"`
	Once                bool     `json:"once"`
	OnceTimeout         Duration `json:"onceTimeout"`
	RelistPeriod        Duration `json:"relistPeriod"`
	ContainerdTimeout   Duration `json:"containerdTimeout"`
	PlainHTTPRegistries []string `json:"plainHTTPRegistries"`
	RegistryCAFile      string   `json:"registryCAFile"`

	// MQTT sync channel. An empty MQTTBroker means standalone: the manifest dir is the only source
	// and nothing is reported.
	MQTTBroker       string   `json:"mqttBroker"`
	MQTTCAFile       string   `json:"mqttCAFile"`
	MQTTCertFile     string   `json:"mqttCertFile"`
	MQTTKeyFile      string   `json:"mqttKeyFile"`
	MQTTUsername     string   `json:"mqttUsername"`
	MQTTPasswordFile string   `json:"mqttPasswordFile"`
	MQTTKeepalive    Duration `json:"mqttKeepalive"`
	MQTTTopicPrefix  string   `json:"mqttTopicPrefix"`
	MQTTReconnectMax Duration `json:"mqttReconnectMax"`
	MQTTMaxPayload   int64    `json:"mqttMaxPayload"`
	// MQTTTrustedKeys are public key files (PEM, Ed25519, from `mqlet ctl keygen`): with any, the
	// node applies only desired state whose index one of them signed. Several allow a rotation.
	MQTTTrustedKeys []string `json:"mqttTrustedKeys"`
	// OutboxMaxBytes bounds the reports queued in the state store while the broker is unreachable.
	OutboxMaxBytes int64 `json:"outboxMaxBytes"`
	// SecretKeyFile is the node key that seals secrets in the state store. It lives outside
	// StateDir, so a copy of the state dir (a backup, a cloned SD card) does not carry its own key.
	SecretKeyFile string `json:"secretKeyFile"`
	// MQTTPolicy limits what pods from MQTT may ask of the node; manifest-dir pods are trusted.
	MQTTPolicy MQTTPolicy `json:"mqttPolicy"`

	// Node status (see policy.go for what each means and how it is checked).
	NodeStatusUpdateFrequency Duration          `json:"nodeStatusUpdateFrequency"`
	NodeStatusMaxImages       int64             `json:"nodeStatusMaxImages"`
	NodeLabels                map[string]string `json:"nodeLabels"`
	NodeTaints                []string          `json:"nodeTaints"`
	MaxPods                   int64             `json:"maxPods"`
	ImageFSDir                string            `json:"imageFSDir"`

	// Pod and QoS cgroups, node allocatable.
	CgroupRoot             string            `json:"cgroupRoot"`
	EnforceNodeAllocatable bool              `json:"enforceNodeAllocatable"`
	SystemReserved         map[string]string `json:"systemReserved"`
	AgentReserved          map[string]string `json:"agentReserved"`
	// PodPidsLimit is kubelet's podPidsLimit: pids.max of each pod's cgroup; -1 (or 0) for none.
	PodPidsLimit int64 `json:"podPidsLimit"`
	// SingleProcessOOMKill is kubelet's singleProcessOOMKill: on cgroup v2, false (the default)
	// sets memory.oom.group=1 on every container, so an OOM kill ends the whole container.
	SingleProcessOOMKill bool `json:"singleProcessOOMKill"`

	// Eviction, kubelet's settings under kubelet's names.
	EvictionHard                     map[string]string `json:"evictionHard"`
	EvictionSoft                     map[string]string `json:"evictionSoft"`
	EvictionSoftGracePeriod          map[string]string `json:"evictionSoftGracePeriod"`
	EvictionMinimumReclaim           map[string]string `json:"evictionMinimumReclaim"`
	EvictionPressureTransitionPeriod Duration          `json:"evictionPressureTransitionPeriod"`
	EvictionMaxPodGracePeriod        Duration          `json:"evictionMaxPodGracePeriod"`
	EvictionMonitoringPeriod         Duration          `json:"evictionMonitoringPeriod"`

	// Image garbage collection.
	ImageGCHighThresholdPercent int64    `json:"imageGCHighThresholdPercent"`
	ImageGCLowThresholdPercent  int64    `json:"imageGCLowThresholdPercent"`
	ImageMinimumGCAge           Duration `json:"imageMinimumGCAge"`

	// Devices maps a resource name to host device nodes, one "NAME=GLOB[:SHARE]" per entry; several
	// entries may name the same resource (see DeviceResources).
	Devices []string `json:"devices"`

	// Graceful node shutdown.
	ShutdownGracePeriod             Duration `json:"shutdownGracePeriod"`
	ShutdownGracePeriodCriticalPods Duration `json:"shutdownGracePeriodCriticalPods"`
	ShutdownSignal                  string   `json:"shutdownSignal"`

	// MetricsAddress serves /metrics, /healthz and /readyz over TCP too; empty: the API socket only.
	// A host without a port listens on DefaultMetricsPort (see MetricsListenAddress).
	MetricsAddress string `json:"metricsAddress"`

	// Pod networking through CNI, and pod DNS (see pods.go).
	CNIConfDir    string   `json:"cniConfDir"`
	CNIBinDirs    []string `json:"cniBinDirs"`
	PodCIDR       string   `json:"podCIDR"`
	ClusterDNS    []string `json:"clusterDNS"`
	ClusterDomain string   `json:"clusterDomain"`
	ResolvConf    string   `json:"resolvConf"`

	// Pod semantics: container log rotation, sysctls, node-wide registry credentials.
	ContainerLogMaxSize  string   `json:"containerLogMaxSize"`
	ContainerLogMaxFiles int64    `json:"containerLogMaxFiles"`
	AllowedUnsafeSysctls []string `json:"allowedUnsafeSysctls"`
	RegistryAuthFile     string   `json:"registryAuthFile"`
}

// MQTTPolicy is the config file's mqttPolicy mapping; see admission.Policy for what each allows.
type MQTTPolicy struct {
	AllowPrivileged     bool     `json:"allowPrivileged"`
	AllowHostNamespaces bool     `json:"allowHostNamespaces"`
	AllowedHostPaths    []string `json:"allowedHostPaths"`
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

// Vars are the defaults by name, for the CLI's flag defaults and help texts (kong's ${name}), so
// that Defaults stays their only home.
func Vars() map[string]string {
	d := Defaults()
	return map[string]string{
		"state_dir":            d.StateDir,
		"containerd_address":   d.ContainerdAddress,
		"containerd_namespace": d.ContainerdNamespace,
		"manifest_dir":         d.ManifestDir,
		"image_preload_dir":    d.ImagePreloadDir,
		"api_socket":           d.APISocket,
		"log_level":            d.LogLevel,
		"log_format":           d.LogFormat,
		"once_timeout":         d.OnceTimeout.String(),
		"relist_period":        d.RelistPeriod.String(),
		"containerd_timeout":   d.ContainerdTimeout.String(),
		"mqtt_keepalive":       d.MQTTKeepalive.String(),
		"mqtt_topic_prefix":    d.MQTTTopicPrefix,
		"mqtt_reconnect_max":   d.MQTTReconnectMax.String(),
		"mqtt_max_payload":     strconv.FormatInt(d.MQTTMaxPayload, 10),
		"outbox_max_bytes":     strconv.FormatInt(d.OutboxMaxBytes, 10),
		"secret_key_file":      d.SecretKeyFile,

		"node_status_update_frequency":        d.NodeStatusUpdateFrequency.String(),
		"node_status_max_images":              strconv.FormatInt(d.NodeStatusMaxImages, 10),
		"max_pods":                            strconv.FormatInt(d.MaxPods, 10),
		"image_fs_dir":                        d.ImageFSDir,
		"cgroup_root":                         d.CgroupRoot,
		"pod_pids_limit":                      strconv.FormatInt(d.PodPidsLimit, 10),
		"eviction_hard":                       mapString(d.EvictionHard, "<"),
		"eviction_pressure_transition_period": d.EvictionPressureTransitionPeriod.String(),
		"eviction_monitoring_period":          d.EvictionMonitoringPeriod.String(),
		"image_gc_high":                       strconv.FormatInt(d.ImageGCHighThresholdPercent, 10),
		"image_gc_low":                        strconv.FormatInt(d.ImageGCLowThresholdPercent, 10),
		"image_minimum_gc_age":                d.ImageMinimumGCAge.String(),
		"shutdown_grace_period":               d.ShutdownGracePeriod.String(),
		"shutdown_grace_period_critical":      d.ShutdownGracePeriodCriticalPods.String(),
		"shutdown_signal":                     d.ShutdownSignal,

		"cni_conf_dir":            d.CNIConfDir,
		"cni_bin_dirs":            strings.Join(d.CNIBinDirs, ","),
		"pod_cidr":                d.PodCIDR,
		"cluster_domain":          d.ClusterDomain,
		"resolv_conf":             d.ResolvConf,
		"container_log_max_size":  d.ContainerLogMaxSize,
		"container_log_max_files": strconv.FormatInt(d.ContainerLogMaxFiles, 10),
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
