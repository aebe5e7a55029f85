package config

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/pkg/identifiers"
	"k8s.io/apimachinery/pkg/util/validation"
)

// FieldError is one invalid setting. It names the setting both as the YAML key and as the
// flag, because the user may have set it either way, and quotes the bad value.
type FieldError struct {
	Key    string // YAML key, e.g. "stateDir"
	Flag   string // flag without dashes, e.g. "state-dir"
	Value  string // the offending value as the user would write it
	Reason string
	// Origin says where the value came from ("flag --state-dir", "environment variable
	// MQLET_STATE_DIR", "config file /etc/mqlet/mqlet.yaml"); empty for a default. Load fills it.
	Origin string
}

func (e *FieldError) Error() string {
	from := ""
	if e.Origin != "" {
		from = " (from " + e.Origin + ")"
	}
	return fmt.Sprintf("invalid %s (--%s) %q%s: %s", e.Key, e.Flag, e.Value, from, e.Reason)
}

// unixPathMax is the usable length of sun_path on Linux (108 bytes including the NUL); a longer
// socket path fails only at bind/connect time with a confusing EINVAL.
const unixPathMax = 107

// Validate checks every setting and reports all problems at once. It writes nothing; it reads only
// the files the MQTT settings name (see validateMQTT).
func (c Config) Validate() error {
	var errs []error
	for _, fe := range c.validate() {
		errs = append(errs, fe)
	}
	return errors.Join(errs...)
}

func (c Config) validate() []*FieldError {
	byKey := map[string]setting{}
	for _, s := range settings() {
		byKey[s.key] = s
	}
	var errs []*FieldError
	bad := func(key, value, reason string, args ...any) {
		errs = append(errs, &FieldError{
			Key: key, Flag: byKey[key].flag, Value: value, Reason: fmt.Sprintf(reason, args...),
		})
	}

	if c.NodeName == "" {
		bad("nodeName", c.NodeName, "must not be empty (the hostname could not be used; set it explicitly)")
	} else if strings.ContainsAny(c.NodeName, "+#/") {
		// DNS-1123 refuses these too; said plainly, since the reason here is MQTT's.
		bad("nodeName", c.NodeName, "must not contain '+', '#' or '/': the node name is the MQTT client id and a topic level")
	} else if msgs := validation.IsDNS1123Subdomain(c.NodeName); len(msgs) > 0 {
		bad("nodeName", c.NodeName, "must be a valid node name (DNS-1123 subdomain): %s", strings.Join(msgs, "; "))
	}

	absPath := func(key, value string) {
		switch {
		case value == "":
			bad(key, value, "must not be empty")
		case !filepath.IsAbs(value):
			bad(key, value, "must be an absolute path")
		}
	}
	absPath("stateDir", c.StateDir)
	absPath("manifestDir", c.ManifestDir)
	absPath("imagePreloadDir", c.ImagePreloadDir)
	absPath("apiSocket", c.APISocket)
	if filepath.IsAbs(c.APISocket) && len(c.APISocket) > unixPathMax {
		bad("apiSocket", c.APISocket, "unix socket path is %d bytes, longer than the %d the kernel allows", len(c.APISocket), unixPathMax)
	}
	if c.RegistryCAFile != "" && !filepath.IsAbs(c.RegistryCAFile) {
		bad("registryCAFile", c.RegistryCAFile, "must be an absolute path (or empty for none)")
	}

	switch addr := c.ContainerdAddress; {
	case addr == "":
		bad("containerdAddress", addr, "must not be empty")
	case strings.Contains(addr, "://") && !strings.HasPrefix(addr, "unix://"):
		bad("containerdAddress", addr, "only unix sockets are supported: want /path or unix:///path")
	case !filepath.IsAbs(c.ContainerdSocketPath()):
		bad("containerdAddress", addr, "socket path must be absolute: want /path or unix:///path")
	case len(c.ContainerdSocketPath()) > unixPathMax:
		bad("containerdAddress", addr, "unix socket path is %d bytes, longer than the %d the kernel allows", len(c.ContainerdSocketPath()), unixPathMax)
	}

	// containerd's own rule for namespace names, so a name it would refuse fails here, early.
	if err := identifiers.Validate(c.ContainerdNamespace); err != nil {
		bad("containerdNamespace", c.ContainerdNamespace, "not a valid containerd namespace: letters, digits, and '.', '_', '-' between them, at most 76 characters")
	}

	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("logLevel", c.LogLevel, "must be one of debug, info, warn, error")
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		bad("logFormat", c.LogFormat, "must be one of text, json")
	}

	positive := func(key string, d Duration) {
		if d.Duration <= 0 {
			bad(key, d.String(), "must be positive")
		}
	}
	positive("onceTimeout", c.OnceTimeout)
	positive("containerdTimeout", c.ContainerdTimeout)
	// Relisting more often than once a second would make the safety net the main load on a
	// small board's containerd.
	if c.RelistPeriod.Duration < time.Second {
		bad("relistPeriod", c.RelistPeriod.String(), "must be at least 1s")
	}

	for _, r := range c.PlainHTTPRegistries {
		if err := validateRegistryHost(r); err != nil {
			bad("plainHTTPRegistries", r, "%v", err)
		}
	}
	c.validateMQTT(bad)
	c.validatePolicy(bad)
	c.validatePods(bad)
	return errs
}

// validateRegistryHost accepts what an image reference's domain part may be: a DNS name or IP,
// with an optional port; "[::1]:5000" for IPv6.
func validateRegistryHost(r string) error {
	if r == "" {
		return errors.New("registry must not be empty")
	}
	if strings.Contains(r, "://") {
		return errors.New("want host[:port] without a scheme")
	}
	if strings.ContainsAny(r, "/ ") {
		return errors.New("want host[:port] without a path or spaces")
	}
	host, port := r, ""
	if strings.HasPrefix(r, "[") || strings.Count(r, ":") == 1 {
		h, p, err := net.SplitHostPort(r)
		if err != nil {
			return fmt.Errorf("want host[:port]: %v", err)
		}
		host, port = h, p
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("port %q must be a number from 1 to 65535", port)
		}
	}
	if net.ParseIP(host) != nil {
		return nil
	}
	if strings.Contains(host, ":") {
		return errors.New("IPv6 addresses need brackets: [addr]:port")
	}
	// Host names are case-insensitive; image references may spell them either way.
	if msgs := validation.IsDNS1123Subdomain(strings.ToLower(host)); len(msgs) > 0 {
		return fmt.Errorf("host %q is not a valid DNS name: %s", host, strings.Join(msgs, "; "))
	}
	return nil
}

// CheckStateDir creates the state directory if needed and proves it is writable, so that a
// read-only or mistyped path fails at start and not at the first bbolt write.
func (c Config) CheckStateDir() error {
	fail := func(what string, err error) error {
		return fmt.Errorf("stateDir (--state-dir) %q: %s: %w", c.StateDir, what, err)
	}
	if err := os.MkdirAll(c.StateDir, 0o700); err != nil {
		return fail("cannot create directory", err)
	}
	// The state dir holds the pods' specs (env values included), their logs and emptyDirs: private
	// on every start, not only when mqlet created it, so a directory made by hand or by an older
	// release is tightened too. Logs get 0750 so a log shipper's group can be let in.
	if err := os.Chmod(c.StateDir, 0o700); err != nil {
		return fail("cannot make it private (0700)", err)
	}
	logs := filepath.Join(c.StateDir, "logs")
	if err := os.Chmod(logs, 0o750); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fail("cannot make the log directory private (0750)", err)
	}
	f, err := os.CreateTemp(c.StateDir, ".mqlet-write-check-*")
	if err != nil {
		return fail("not writable", err)
	}
	name := f.Name()
	if err := f.Close(); err != nil {
		os.Remove(name)
		return fail("not writable", err)
	}
	if err := os.Remove(name); err != nil {
		return fail("cannot remove write-check file", err)
	}
	return nil
}
