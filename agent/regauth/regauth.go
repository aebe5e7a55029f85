// Package regauth finds registry credentials for an image, the way kubelet's credential keyring
// does: from docker config files (the node-wide registryAuthFile) and from a pod's imagePullSecrets
// (Secrets of type kubernetes.io/dockerconfigjson or kubernetes.io/dockercfg). A key in such a file
// names a registry host (globs allowed per label, "*.example.com"), optionally a port and a path
// prefix ("registry.example.com:5000/team"); it matches an image whose repository is on that host
// and port and under that path. The most specific keys are tried first.
//
// Nothing here ever puts a password or token into an error message or a String.
package regauth

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/distribution/reference"
)

// Credential is one registry login. With Username empty, Secret is an identity (refresh) token;
// otherwise it is the password.
type Credential struct {
	Username string
	Secret   string
	// From says where the credential came from, for logs: "registryAuthFile", "secret ns/name".
	From string
	// Key is the config key it was listed under.
	Key string
}

// String shows where the credential is from, never the secret.
func (c Credential) String() string { return c.From + " (" + c.Key + ")" }

// GoString is String: %#v must not print the secret either.
func (c Credential) GoString() string { return c.String() }

type entry struct {
	key  string // normalised: host[:port][/path]
	host string
	port string
	path string
	cred Credential
}

// Keyring holds credentials by registry key.
type Keyring struct {
	entries []entry
}

// Len is how many credentials the keyring holds.
func (k *Keyring) Len() int {
	if k == nil {
		return 0
	}
	return len(k.entries)
}

// dockerConfigEntry is one "auths" value of a docker config.
type dockerConfigEntry struct {
	Auth          string `json:"auth"`
	Username      string `json:"username"`
	Password      string `json:"password"`
	IdentityToken string `json:"identitytoken"`
}

// ParseConfigJSON reads a docker config.json ({"auths": {...}}, the .dockerconfigjson key of a
// Secret). from names it in Credential.From and in errors.
func ParseConfigJSON(b []byte, from string) (*Keyring, error) {
	var doc struct {
		Auths map[string]dockerConfigEntry `json:"auths"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: not a docker config.json: %v", from, jsonProblem(err))
	}
	return fromEntries(doc.Auths, from)
}

// ParseDockercfg reads the legacy ~/.dockercfg layout (a map of keys to entries, the .dockercfg
// key of a kubernetes.io/dockercfg Secret).
func ParseDockercfg(b []byte, from string) (*Keyring, error) {
	var auths map[string]dockerConfigEntry
	if err := json.Unmarshal(b, &auths); err != nil {
		return nil, fmt.Errorf("%s: not a .dockercfg: %v", from, jsonProblem(err))
	}
	return fromEntries(auths, from)
}

// jsonProblem keeps a decoding error's kind and offset but not the text around it.
func jsonProblem(err error) string {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return fmt.Sprintf("JSON syntax error at byte %d", syn.Offset)
	}
	var typ *json.UnmarshalTypeError
	if errors.As(err, &typ) {
		return fmt.Sprintf("field %q has the wrong type (%s)", typ.Field, typ.Value)
	}
	return "cannot decode it"
}

func fromEntries(auths map[string]dockerConfigEntry, from string) (*Keyring, error) {
	k := &Keyring{}
	for key, e := range auths {
		c := Credential{Username: e.Username, Secret: e.Password, From: from, Key: key}
		if e.Auth != "" {
			raw, err := base64.StdEncoding.DecodeString(e.Auth)
			if err != nil {
				return nil, fmt.Errorf("%s: key %q: auth is not base64", from, key)
			}
			user, pass, ok := strings.Cut(string(raw), ":")
			if !ok {
				return nil, fmt.Errorf("%s: key %q: auth is not base64 of user:password", from, key)
			}
			c.Username, c.Secret = user, pass
		}
		if c.Username == "" && c.Secret == "" && e.IdentityToken != "" {
			c.Secret = e.IdentityToken
		}
		if c.Username == "" && c.Secret == "" {
			continue // an entry with only an email, or a credential helper's placeholder
		}
		en, err := parseKey(key)
		if err != nil {
			return nil, fmt.Errorf("%s: key %q: %v", from, key, err)
		}
		en.cred = c
		k.entries = append(k.entries, en)
	}
	k.sort()
	return k, nil
}

// dockerHub are the names of Docker Hub's registry in config keys; images there are "docker.io".
var dockerHub = map[string]bool{"docker.io": true, "index.docker.io": true, "registry-1.docker.io": true}

// parseKey reads "https://host:port/path/", "host/path", "*.host" into its parts. The "/v1/" and
// "/v2/" API paths docker writes into keys are not repository paths.
func parseKey(key string) (entry, error) {
	s := key
	if !strings.Contains(s, "://") {
		s = "https://" + s
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return entry{}, errors.New("not a registry host[:port][/path]")
	}
	p := strings.TrimSuffix(u.Path, "/")
	for _, api := range []string{"/v1", "/v2"} {
		if p == api || strings.HasPrefix(p, api+"/") {
			p = strings.TrimPrefix(p, api)
		}
	}
	host := strings.ToLower(u.Hostname())
	if dockerHub[host] {
		host = "docker.io"
	}
	return entry{key: host + portSuffix(u.Port()) + p, host: host, port: u.Port(), path: strings.TrimPrefix(p, "/")}, nil
}

func portSuffix(p string) string {
	if p == "" {
		return ""
	}
	return ":" + p
}

// sort puts the most specific keys first: kubelet orders its keys in reverse lexical order, so a
// key with a path comes before its host alone.
func (k *Keyring) sort() {
	sort.SliceStable(k.entries, func(i, j int) bool { return k.entries[i].key > k.entries[j].key })
}

// Lookup returns the credentials whose key matches image, most specific first. image is any
// reference containerd or a pod would use ("busybox", "registry:5000/team/app:1").
func (k *Keyring) Lookup(image string) []Credential {
	if k == nil {
		return nil
	}
	named, err := reference.ParseDockerRef(image)
	if err != nil {
		return nil
	}
	domain, path := reference.Domain(named), reference.Path(named)
	host, port := domain, ""
	if h, p, ok := strings.Cut(domain, ":"); ok {
		host, port = h, p
	}
	host = strings.ToLower(host)
	var out []Credential
	for _, e := range k.entries {
		if e.port == port && hostMatches(e.host, host) && pathMatches(e.path, path) {
			out = append(out, e.cred)
		}
	}
	return out
}

// hostMatches matches label by label, each label of the key a glob, with as many labels on both
// sides ("*.example.com" matches "a.example.com", not "example.com" nor "a.b.example.com").
func hostMatches(pattern, host string) bool {
	pl, hl := strings.Split(pattern, "."), strings.Split(host, ".")
	if len(pl) != len(hl) {
		return false
	}
	for i := range pl {
		if ok, err := filepath.Match(pl[i], hl[i]); err != nil || !ok {
			return false
		}
	}
	return true
}

// pathMatches: the key's path is a prefix of the repository path, on '/' boundaries.
func pathMatches(prefix, path string) bool {
	return prefix == "" || path == prefix || strings.HasPrefix(path, prefix+"/")
}

// LookupAll looks image up in each ring in turn and returns every match, in ring order.
func LookupAll(rings []*Keyring, image string) []Credential {
	var out []Credential
	for _, r := range rings {
		out = append(out, r.Lookup(image)...)
	}
	return out
}

// LoadFile reads the node-wide credentials file (registryAuthFile): a docker config.json that
// only its owner may read or change. A file open to others is refused, as ssh refuses a key file:
// registry passwords must not be readable by every user of the node.
func LoadFile(path string) (*Keyring, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("registryAuthFile %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("registryAuthFile %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("registryAuthFile %s: not a regular file", path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("registryAuthFile %s: mode %#o lets other users read or change registry passwords; make it 0600 (chmod 600 %s)", path, perm, path)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("registryAuthFile %s: %w", path, err)
	}
	return ParseConfigJSON(b, "registryAuthFile "+path)
}
