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

	"sigs.k8s.io/yaml"
)

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
