package config

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
)

// parseFlags runs the real kong parser over args, as `mqlet agent` would.
func parseFlags(t *testing.T, args ...string) (Flags, error) {
	t.Helper()
	var cli struct {
		Flags `embed:""`
	}
	parser, err := kong.New(&cli, kong.Name("mqlet-agent-test"), kong.Vars(Vars()))
	if err != nil {
		t.Fatalf("building kong parser: %v", err)
	}
	_, err = parser.Parse(args)
	return cli.Flags, err
}

func mustParseFlags(t *testing.T, args ...string) Flags {
	t.Helper()
	f, err := parseFlags(t, args...)
	if err != nil {
		t.Fatalf("parsing %q: %v", args, err)
	}
	return f
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "mqlet.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func ptr[T any](v T) *T { return &v }

// requireErr fails unless err is non-nil and its text contains every one of wants.
func requireErr(t *testing.T, err error, wants ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one mentioning %q", wants)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

func TestDefaults(t *testing.T) {
	d := Defaults()
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if d.NodeName != strings.ToLower(host) {
		t.Errorf("NodeName = %q, want lowercased hostname %q", d.NodeName, strings.ToLower(host))
	}
	want := Config{
		NodeName:            d.NodeName,
		StateDir:            "/var/lib/mqlet",
		ContainerdAddress:   "/run/containerd/containerd.sock",
		ContainerdNamespace: "mqlet",
		ManifestDir:         "/etc/mqlet/pods",
		ImagePreloadDir:     "/var/lib/mqlet/images",
		APISocket:           "/run/mqlet/mqlet.sock",
		LogLevel:            "info",
		LogFormat:           "text",
		OnceTimeout:         Duration{5 * time.Minute},
		RelistPeriod:        Duration{10 * time.Second},
		ContainerdTimeout:   Duration{10 * time.Second},
		MQTTKeepalive:       Duration{60 * time.Second},
		MQTTTopicPrefix:     "mqlet/v2",
		MQTTReconnectMax:    Duration{2 * time.Minute},
		MQTTMaxPayload:      1048576,
		OutboxMaxBytes:      1048576,
		SecretKeyFile:       "/etc/mqlet/node.key",

		NodeStatusUpdateFrequency: Duration{10 * time.Second},
		NodeStatusMaxImages:       50,
		MaxPods:                   110,
		ImageFSDir:                "/var/lib/containerd",
		CgroupDriver:              "auto",
		CgroupRoot:                "/mqlet",
		EnforceNodeAllocatable:    true,
		PodPidsLimit:              -1,
		EvictionHard: map[string]string{"memory.available": "100Mi", "nodefs.available": "10%",
			"nodefs.inodesFree": "5%", "imagefs.available": "15%", "imagefs.inodesFree": "5%"},
		EvictionPressureTransitionPeriod: Duration{5 * time.Minute},
		EvictionMonitoringPeriod:         Duration{10 * time.Second},
		ImageGCHighThresholdPercent:      85,
		ImageGCLowThresholdPercent:       80,
		ImageMinimumGCAge:                Duration{2 * time.Minute},
		ShutdownGracePeriod:              Duration{30 * time.Second},
		ShutdownGracePeriodCriticalPods:  Duration{10 * time.Second},
		ShutdownSignal:                   "SIGPWR",
		CNIConfDir:                       "/etc/cni/net.d",
		CNIBinDirs:                       []string{"/opt/cni/bin", "/usr/lib/cni"},
		PodCIDR:                          "10.89.0.0/24",
		ClusterDomain:                    "cluster.local",
		ResolvConf:                       "/etc/resolv.conf",
		ContainerLogMaxSize:              "10Mi",
		ContainerLogMaxFiles:             5,
	}
	if !reflect.DeepEqual(d, want) {
		t.Errorf("Defaults() = %+v\nwant %+v", d, want)
	}
	if got, want := d.StatePath(), "/var/lib/mqlet/state.db"; got != want {
		t.Errorf("StatePath() = %q, want %q", got, want)
	}
	// The hostname of a test machine may not be a valid node name; the rest must validate.
	d.NodeName = "node-1"
	if err := d.Validate(); err != nil {
		t.Errorf("defaults do not validate: %v", err)
	}

	c, err := Load(Flags{NodeName: ptr("node-1")}, nil)
	if err != nil {
		t.Fatalf("Load with no file, env or flags: %v", err)
	}
	if !reflect.DeepEqual(c, d) {
		t.Errorf("Load() = %+v\nwant defaults %+v", c, d)
	}
}

func TestKongLeavesAbsentFlagsNil(t *testing.T) {
	f := mustParseFlags(t)
	v := reflect.ValueOf(f)
	for i := 0; i < v.NumField(); i++ {
		field := v.Field(i)
		name := v.Type().Field(i).Name
		switch field.Kind() {
		case reflect.Pointer, reflect.Slice:
			if !field.IsNil() {
				t.Errorf("%s is %v with no flags given, want nil", name, field.Elem())
			}
		}
	}

	// Zero values given explicitly must be distinguishable from absent flags.
	f = mustParseFlags(t, "--once=false", "--node-name=", "--relist-period=0s")
	if f.Once == nil || *f.Once {
		t.Errorf("--once=false: Once = %v, want pointer to false", f.Once)
	}
	if f.NodeName == nil || *f.NodeName != "" {
		t.Errorf("--node-name=: NodeName = %v, want pointer to empty string", f.NodeName)
	}
	if f.RelistPeriod == nil || *f.RelistPeriod != 0 {
		t.Errorf("--relist-period=0s: RelistPeriod = %v, want pointer to 0", f.RelistPeriod)
	}

	f = mustParseFlags(t, "--once", "--plain-http-registry=a:5000", "--plain-http-registry", "b:5000,c")
	if f.Once == nil || !*f.Once {
		t.Errorf("--once: Once = %v, want pointer to true", f.Once)
	}
	if want := []string{"a:5000", "b:5000", "c"}; !reflect.DeepEqual(f.PlainHTTPRegistries, want) {
		t.Errorf("PlainHTTPRegistries = %q, want %q", f.PlainHTTPRegistries, want)
	}
}

// Every flag in Flags must correspond to a setting and vice versa, so a new setting cannot be
// added to one place and forgotten in another.
func TestFlagsCoverEverySetting(t *testing.T) {
	var cli struct {
		Flags `embed:""`
	}
	parser := kong.Must(&cli, kong.Vars(Vars()))
	flags := map[string]bool{}
	for _, fl := range parser.Model.Flags {
		if fl.Name != "help" && fl.Name != "config" {
			flags[fl.Name] = true
		}
	}
	for _, s := range settings() {
		if !flags[s.flag] {
			t.Errorf("setting %s has no flag --%s", s.key, s.flag)
		}
		delete(flags, s.flag)
		// A repeatable list flag is singular (--plain-http-registry), its variable plural.
		plural := map[string]string{
			"plainHTTPRegistries":         "MQLET_PLAIN_HTTP_REGISTRIES",
			"mqttPolicy.allowedHostPaths": "MQLET_MQTT_ALLOWED_HOST_PATHS",
			"nodeLabels":                  "MQLET_NODE_LABELS",
			"nodeTaints":                  "MQLET_NODE_TAINTS",
			"devices":                     "MQLET_DEVICES",
			"cniBinDirs":                  "MQLET_CNI_BIN_DIRS",
			"clusterDNS":                  "MQLET_CLUSTER_DNS",
			"allowedUnsafeSysctls":        "MQLET_ALLOWED_UNSAFE_SYSCTLS",
		}
		want := "MQLET_" + strings.ToUpper(strings.ReplaceAll(s.flag, "-", "_"))
		if p, ok := plural[s.key]; ok {
			want = p
		}
		if s.env != want {
			t.Errorf("setting %s: env %s, want %s", s.key, s.env, want)
		}
		index, ok := jsonField(reflect.TypeOf(Config{}), s.key)
		if !ok {
			t.Errorf("setting %s is not a json key of Config", s.key)
			continue
		}
		c := Config{}
		if got := reflect.ValueOf(s.field(&c)).Pointer(); got != reflect.ValueOf(&c).Elem().FieldByIndex(index).Addr().Pointer() {
			t.Errorf("setting %s points at the wrong Config field", s.key)
		}
	}
	for name := range flags {
		t.Errorf("flag --%s has no setting", name)
	}
}

// jsonField finds the field of t whose json tags spell key ("a.b" for field b of struct field a).
func jsonField(t reflect.Type, key string) ([]int, bool) {
	name, rest, nested := strings.Cut(key, ".")
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if strings.Split(f.Tag.Get("json"), ",")[0] != name {
			continue
		}
		if !nested {
			return []int{i}, true
		}
		if f.Type.Kind() != reflect.Struct {
			return nil, false
		}
		sub, ok := jsonField(f.Type, rest)
		return append([]int{i}, sub...), ok
	}
	return nil, false
}

// The help text is the only place defaults are shown (the flags carry no kong default, so
// that absent flags stay nil); check each one against Defaults().
func TestHelpStatesDefaults(t *testing.T) {
	var cli struct {
		Flags `embed:""`
	}
	parser := kong.Must(&cli, kong.Vars(Vars()))
	help := map[string]string{}
	for _, fl := range parser.Model.Flags {
		help[fl.Name] = fl.Help
	}
	defaultRe := regexp.MustCompile(`\(default ([^)]*)\)\.?$`)
	for _, s := range settings() {
		m := defaultRe.FindStringSubmatch(help[s.flag])
		if m == nil {
			t.Errorf("help of --%s does not end with (default ...): %q", s.flag, help[s.flag])
			continue
		}
		if s.key == "nodeName" {
			continue // the default depends on the machine
		}
		stated := Config{}
		if m[1] != "none" {
			if err := setFromString(s.field(&stated), m[1]); err != nil {
				t.Errorf("--%s help states default %q, which does not parse: %v", s.flag, m[1], err)
				continue
			}
		}
		d := Defaults()
		if got, want := reflect.ValueOf(s.field(&stated)).Elem().Interface(), reflect.ValueOf(s.field(&d)).Elem().Interface(); !reflect.DeepEqual(got, want) {
			t.Errorf("--%s help states default %q, Defaults() has %v", s.flag, m[1], want)
		}
	}
}

func TestPrecedenceFileEnvFlag(t *testing.T) {
	type layers struct{ file, env, flag bool }
	rows := []struct {
		key, envName, flag    string
		def, file, env, flagV string
		get                   func(Config) string
	}{
		{"logLevel", "MQLET_LOG_LEVEL", "log-level", "info", "warn", "error", "debug",
			func(c Config) string { return c.LogLevel }},
		{"stateDir", "MQLET_STATE_DIR", "state-dir", "/var/lib/mqlet", "/srv/file", "/srv/env", "/srv/flag",
			func(c Config) string { return c.StateDir }},
		{"relistPeriod", "MQLET_RELIST_PERIOD", "relist-period", "10s", "20s", "30s", "40s",
			func(c Config) string { return c.RelistPeriod.String() }},
		{"once", "MQLET_ONCE", "once", "false", "true", "false", "true",
			func(c Config) string { return map[bool]string{true: "true", false: "false"}[c.Once] }},
		{"plainHTTPRegistries", "MQLET_PLAIN_HTTP_REGISTRIES", "plain-http-registry", "", "file:5000", "env:5000", "flag:5000",
			func(c Config) string { return strings.Join(c.PlainHTTPRegistries, ",") }},
	}
	for _, r := range rows {
		for _, l := range []layers{{}, {file: true}, {env: true}, {flag: true}, {true, true, false}, {true, false, true}, {false, true, true}, {true, true, true}} {
			want := r.def
			var f Flags
			args := []string{"--node-name=n1"}
			var environ []string
			if l.file {
				val := r.file
				if r.key == "plainHTTPRegistries" {
					val = "[" + val + "]"
				}
				f.Config = writeFile(t, r.key+": "+val+"\n")
				want = r.file
			}
			if l.env {
				environ = append(environ, r.envName+"="+r.env)
				want = r.env
			}
			if l.flag {
				args = append(args, "--"+r.flag+"="+r.flagV)
				want = r.flagV
			}
			parsed := mustParseFlags(t, args...)
			parsed.Config = f.Config
			c, err := Load(parsed, append(environ, "PATH=/usr/bin"))
			if err != nil {
				t.Errorf("%s %+v: %v", r.key, l, err)
				continue
			}
			if r.key == "relistPeriod" {
				d, _ := time.ParseDuration(want)
				want = d.String()
			}
			if got := r.get(c); got != want {
				t.Errorf("%s with layers %+v = %q, want %q", r.key, l, got, want)
			}
		}
	}
}

func TestConfigFromMQLETConfigEnv(t *testing.T) {
	p := writeFile(t, "logLevel: debug\n")
	c, err := Load(Flags{NodeName: ptr("n1")}, []string{"MQLET_CONFIG=" + p})
	if err != nil {
		t.Fatal(err)
	}
	if c.LogLevel != "debug" {
		t.Errorf("LogLevel = %q, want debug from the file named by MQLET_CONFIG", c.LogLevel)
	}
	// The flag names the file when both are given.
	other := writeFile(t, "logLevel: warn\n")
	c, err = Load(Flags{Config: other, NodeName: ptr("n1")}, []string{"MQLET_CONFIG=" + p})
	if err != nil {
		t.Fatal(err)
	}
	if c.LogLevel != "warn" {
		t.Errorf("LogLevel = %q, want warn from --config", c.LogLevel)
	}
}

func TestFileErrors(t *testing.T) {
	tests := []struct {
		name, yaml string
		wants      []string
	}{
		{"unknown key", "stateDirectory: /x\n", []string{`unknown key "stateDirectory"`}},
		{"wrong case", "statedir: /x\n", []string{`unknown key "statedir"`, `did you mean "stateDir"`}},
		{"bad duration", "onceTimeout: 5 minutes\n", []string{"onceTimeout", `"5 minutes"`}},
		{"number as duration", "relistPeriod: 10\n", []string{"relistPeriod", "10", "quoted Go duration"}},
		{"wrong type", "once: sometimes\n", []string{"once", `"sometimes"`, "true or false"}},
		{"YAML bool as string", "logLevel: off\n", []string{"logLevel", "a bool (false)", "quote the value"}},
		{"list as string", "plainHTTPRegistries: a:5000\n", []string{"plainHTTPRegistries", "list of strings"}},
		{"duplicate key", "logLevel: info\nlogLevel: debug\n", []string{"logLevel"}},
		{"not a mapping", "- a\n- b\n", []string{"mapping"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, tt.yaml)
			_, err := Load(Flags{Config: p, NodeName: ptr("n1")}, nil)
			requireErr(t, err, append(tt.wants, p)...)
		})
	}

	t.Run("missing file", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "nope.yaml")
		_, err := Load(Flags{Config: p, NodeName: ptr("n1")}, nil)
		requireErr(t, err, p, "--config", "no such file")
	})

	t.Run("empty file", func(t *testing.T) {
		p := writeFile(t, "# only a comment\n")
		if _, err := Load(Flags{Config: p, NodeName: ptr("n1")}, nil); err != nil {
			t.Errorf("comment-only file: %v", err)
		}
	})

	t.Run("null value leaves the default", func(t *testing.T) {
		p := writeFile(t, "stateDir:\nonceTimeout: null\n")
		c, err := Load(Flags{Config: p, NodeName: ptr("n1")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.StateDir != "/var/lib/mqlet" || c.OnceTimeout.Duration != 5*time.Minute {
			t.Errorf("got stateDir %q onceTimeout %v, want the defaults", c.StateDir, c.OnceTimeout)
		}
	})

	t.Run("bad key keeps default and other keys still apply", func(t *testing.T) {
		p := writeFile(t, "onceTimeout: soon\nlogLevel: debug\n")
		c, err := Load(Flags{Config: p, NodeName: ptr("n1")}, nil)
		requireErr(t, err, "onceTimeout")
		if c.LogLevel != "debug" || c.OnceTimeout.Duration != 5*time.Minute {
			t.Errorf("got logLevel %q onceTimeout %v, want debug and the 5m default", c.LogLevel, c.OnceTimeout)
		}
	})
}

func TestEnvErrors(t *testing.T) {
	tests := []struct {
		name    string
		environ []string
		wants   []string
	}{
		{"unknown MQLET var", []string{"MQLET_STATEDIR=/x"}, []string{"MQLET_STATEDIR", "unknown environment variable"}},
		{"bad duration", []string{"MQLET_ONCE_TIMEOUT=5 minutes"}, []string{"MQLET_ONCE_TIMEOUT", `"5 minutes"`, "onceTimeout", "--once-timeout"}},
		{"bad bool", []string{"MQLET_ONCE=sometimes"}, []string{"MQLET_ONCE", `"sometimes"`, "not a bool"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(Flags{NodeName: ptr("n1")}, tt.environ)
			requireErr(t, err, tt.wants...)
		})
	}

	t.Run("ignored variables", func(t *testing.T) {
		environ := []string{"MQLET_TEST_CONTAINERD=1", "HOME=/root", "MQLET=1", "NOEQUALS", "MQLET_CONFIG="}
		if _, err := Load(Flags{NodeName: ptr("n1")}, environ); err != nil {
			t.Errorf("Load(%q): %v", environ, err)
		}
	})
}

func TestBadFlagDuration(t *testing.T) {
	_, err := parseFlags(t, "--relist-period=ten")
	requireErr(t, err, "--relist-period", `"ten"`)

	// A duration that parses but is out of range is caught by Load and blamed on the flag.
	f := mustParseFlags(t, "--node-name=n1", "--relist-period=100ms")
	_, err = Load(f, []string{"MQLET_RELIST_PERIOD=20s"})
	requireErr(t, err, "relistPeriod", "--relist-period", `"100ms"`, "at least 1s", "from flag --relist-period")
}

func TestValidate(t *testing.T) {
	valid := Defaults()
	valid.NodeName = "node-1"
	tests := []struct {
		name   string
		mutate func(*Config)
		wants  []string // empty: must be valid
	}{
		{"uppercase node name", func(c *Config) { c.NodeName = "Node-1" }, []string{"nodeName", "--node-name", `"Node-1"`}},
		{"node name with underscore", func(c *Config) { c.NodeName = "node_1" }, []string{"nodeName", `"node_1"`}},
		{"empty node name", func(c *Config) { c.NodeName = "" }, []string{"nodeName", "must not be empty"}},
		{"dotted node name", func(c *Config) { c.NodeName = "pi.factory.local" }, nil},
		{"relative state dir", func(c *Config) { c.StateDir = "var/lib/mqlet" }, []string{"stateDir", "--state-dir", `"var/lib/mqlet"`, "absolute"}},
		{"empty manifest dir", func(c *Config) { c.ManifestDir = "" }, []string{"manifestDir", "--manifest-dir", "empty"}},
		{"relative preload dir", func(c *Config) { c.ImagePreloadDir = "images" }, []string{"imagePreloadDir", "--image-preload-dir"}},
		{"relative api socket", func(c *Config) { c.APISocket = "mqlet.sock" }, []string{"apiSocket", "--api-socket"}},
		{"long api socket", func(c *Config) { c.APISocket = "/" + strings.Repeat("a", 120) }, []string{"apiSocket", "longer than"}},
		{"relative CA file", func(c *Config) { c.RegistryCAFile = "ca.pem" }, []string{"registryCAFile", "--registry-ca-file"}},
		{"unix:// containerd", func(c *Config) { c.ContainerdAddress = "unix:///run/containerd/containerd.sock" }, nil},
		{"tcp containerd", func(c *Config) { c.ContainerdAddress = "tcp://127.0.0.1:1234" }, []string{"containerdAddress", "--containerd-address", "unix"}},
		{"relative containerd", func(c *Config) { c.ContainerdAddress = "unix://containerd.sock" }, []string{"containerdAddress", "absolute"}},
		{"bad namespace", func(c *Config) { c.ContainerdNamespace = "my ns" }, []string{"containerdNamespace", "--containerd-namespace", `"my ns"`}},
		{"namespace trailing dash", func(c *Config) { c.ContainerdNamespace = "mqlet-" }, []string{"containerdNamespace"}},
		{"namespace with dots", func(c *Config) { c.ContainerdNamespace = "mqlet.edge_1" }, nil},
		{"log level", func(c *Config) { c.LogLevel = "verbose" }, []string{"logLevel", "--log-level", `"verbose"`, "debug, info, warn, error"}},
		{"log format", func(c *Config) { c.LogFormat = "xml" }, []string{"logFormat", "--log-format", `"xml"`}},
		{"zero once timeout", func(c *Config) { c.OnceTimeout = Duration{} }, []string{"onceTimeout", "--once-timeout", `"0s"`, "positive"}},
		{"negative containerd timeout", func(c *Config) { c.ContainerdTimeout = Duration{-time.Second} }, []string{"containerdTimeout", `"-1s"`}},
		{"fast relist", func(c *Config) { c.RelistPeriod = Duration{999 * time.Millisecond} }, []string{"relistPeriod", `"999ms"`, "at least 1s"}},
		{"relist 1s", func(c *Config) { c.RelistPeriod = Duration{time.Second} }, nil},
		{"good registries", func(c *Config) {
			c.PlainHTTPRegistries = []string{"localhost:5000", "registry.local", "192.168.1.10:5000", "[::1]:5000", "::1", "Registry.Local:80"}
		}, nil},
		{"registry with scheme", func(c *Config) { c.PlainHTTPRegistries = []string{"http://reg:5000"} }, []string{"plainHTTPRegistries", "--plain-http-registry", `"http://reg:5000"`, "scheme"}},
		{"registry with path", func(c *Config) { c.PlainHTTPRegistries = []string{"reg:5000/library"} }, []string{"path"}},
		{"registry bad port", func(c *Config) { c.PlainHTTPRegistries = []string{"reg:99999"} }, []string{`"99999"`}},
		{"registry bad host", func(c *Config) { c.PlainHTTPRegistries = []string{"reg_1:5000"} }, []string{`"reg_1"`}},
		{"registry empty", func(c *Config) { c.PlainHTTPRegistries = []string{""} }, []string{"plainHTTPRegistries", "empty"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid
			c.PlainHTTPRegistries = nil
			tt.mutate(&c)
			err := c.Validate()
			if len(tt.wants) == 0 {
				if err != nil {
					t.Errorf("want valid, got %v", err)
				}
				return
			}
			requireErr(t, err, tt.wants...)
		})
	}
}

// All static problems are reported together, one per bad setting, each with its origin.
func TestLoadReportsAllProblems(t *testing.T) {
	p := writeFile(t, "stateDir: relative\nbogus: 1\n")
	f := mustParseFlags(t, "--config="+p, "--node-name=Bad_Name", "--log-format=xml")
	_, err := Load(f, []string{"MQLET_LOG_LEVEL=loud", "MQLET_NOPE=1"})
	requireErr(t, err,
		`unknown key "bogus"`,
		"MQLET_NOPE",
		`invalid stateDir (--state-dir) "relative" (from config file `+p+`)`,
		`invalid logLevel (--log-level) "loud" (from environment variable MQLET_LOG_LEVEL)`,
		`invalid nodeName (--node-name) "Bad_Name" (from flag --node-name)`,
		`invalid logFormat (--log-format) "xml" (from flag --log-format)`,
	)
	if n := len(strings.Split(err.Error(), "\n")); n != 6 {
		t.Errorf("got %d error lines, want 6 (one per problem):\n%v", n, err)
	}
}

func TestCheckStateDir(t *testing.T) {
	c := Defaults()
	c.StateDir = filepath.Join(t.TempDir(), "a", "b")
	if err := c.CheckStateDir(); err != nil {
		t.Fatalf("CheckStateDir(%s): %v", c.StateDir, err)
	}
	st, err := os.Stat(c.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o700 {
		t.Errorf("state dir mode %v, want 0700", st.Mode().Perm())
	}
	entries, _ := os.ReadDir(c.StateDir)
	if len(entries) != 0 {
		t.Errorf("write-check left files behind: %v", entries)
	}

	// A path below a regular file cannot be created, even by root.
	file := filepath.Join(t.TempDir(), "regular")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c.StateDir = filepath.Join(file, "x")
	requireErr(t, c.CheckStateDir(), "stateDir", "--state-dir", c.StateDir, "not a directory")
}

func TestExampleConfigLoads(t *testing.T) {
	path := filepath.Join("..", "..", "configs", "mqlet.yaml")
	c, err := Load(Flags{Config: path, NodeName: ptr("example-node")}, nil)
	if err != nil {
		t.Fatalf("Load(%s): %v", path, err)
	}
	want := Defaults()
	want.NodeName = "example-node"
	if !reflect.DeepEqual(c, want) {
		t.Errorf("example config differs from the defaults it claims to show:\n got %+v\nwant %+v", c, want)
	}
	// Every key appears in the example, set or (nodeName) commented out; a key of a group is
	// indented under the group's.
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range settings() {
		pattern := `(?m)^#? ?` + s.key + `:`
		if group, leaf, ok := strings.Cut(s.key, "."); ok {
			pattern = `(?m)^#? ?` + group + `:\n(?:#? +.*\n)*?#? +` + leaf + `:`
		}
		if !regexp.MustCompile(pattern).Match(data) {
			t.Errorf("example config does not show key %s", s.key)
		}
	}
}

func TestDurationJSON(t *testing.T) {
	b, err := json.Marshal(Duration{90 * time.Second})
	if err != nil || string(b) != `"1m30s"` {
		t.Errorf("Marshal = %s, %v; want \"1m30s\"", b, err)
	}
	var d Duration
	if err := json.Unmarshal([]byte(`"250ms"`), &d); err != nil || d.Duration != 250*time.Millisecond {
		t.Errorf("Unmarshal 250ms = %v, %v", d, err)
	}
	err = json.Unmarshal([]byte(`"fortnight"`), &d)
	requireErr(t, err, `"fortnight"`)
}
