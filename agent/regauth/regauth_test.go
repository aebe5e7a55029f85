package regauth

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func auth(user, pass string) string {
	return base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
}

func TestLookupMatchesLikeKubeletsKeyring(t *testing.T) {
	cfg := fmt.Sprintf(`{"auths": {
		"https://index.docker.io/v1/": {"auth": %q},
		"registry.example.com:5000": {"username": "port", "password": "p1"},
		"registry.example.com:5000/team": {"auth": %q},
		"*.corp.example": {"auth": %q},
		"https://plain.example/v2/": {"identitytoken": "tok"},
		"emailonly.example": {"email": "x@y"}
	}}`, auth("hub", "h"), auth("team", "t"), auth("glob", "g"))
	k, err := ParseConfigJSON([]byte(cfg), "test")
	if err != nil {
		t.Fatal(err)
	}
	users := func(image string) string {
		var out []string
		for _, c := range k.Lookup(image) {
			out = append(out, c.Username+"/"+c.Secret)
		}
		return strings.Join(out, ",")
	}
	for image, want := range map[string]string{
		"busybox":                                           "hub/h",
		"docker.io/library/busybox:1":                       "hub/h",
		"registry.example.com:5000/team/app:1":              "team/t,port/p1", // the path key first
		"registry.example.com:5000/teamwork/app:1":          "port/p1",        // a prefix on '/' boundaries only
		"registry.example.com:5000/other/app":               "port/p1",
		"registry.example.com/team/app":                     "", // another port
		"a.corp.example/x":                                  "glob/g",
		"a.b.corp.example/x":                                "", // a glob is one label
		"corp.example/x":                                    "",
		"plain.example/x@sha256:" + strings.Repeat("a", 64): "/tok", // an identity token
		"emailonly.example/x":                               "",
		"quay.io/x":                                         "",
	} {
		if got := users(image); got != want {
			t.Errorf("Lookup(%q) = %q, want %q", image, got, want)
		}
	}
}

func TestParseErrorsHoldNoSecret(t *testing.T) {
	for _, cfg := range []string{
		`{"auths": {"r.example": {"auth": "!!Sup3rS3cret!!"}}}`,
		`{"auths": {"r.example": {"auth": "` + base64.StdEncoding.EncodeToString([]byte("Sup3rS3cret")) + `"}}}`,
		`{"auths": {"r.example": {"password": Sup3rS3cret}}}`,
		`{"auths": {"r.example": {"password": 12, "username": "Sup3rS3cret"}}}`,
	} {
		_, err := ParseConfigJSON([]byte(cfg), "Secret default/pull")
		if err == nil {
			t.Errorf("%s: no error", cfg)
			continue
		}
		if strings.Contains(err.Error(), "Sup3rS3cret") {
			t.Errorf("error quotes the secret: %v", err)
		}
		if !strings.Contains(err.Error(), "Secret default/pull") {
			t.Errorf("error does not name its source: %v", err)
		}
	}
	c := Credential{Username: "u", Secret: "Sup3rS3cret", From: "f", Key: "k"}
	if s := fmt.Sprintf("%v %+v %#v %s", c, c, c, c); strings.Contains(s, "Sup3rS3cret") {
		t.Errorf("formatting a credential shows its secret: %s", s)
	}
}

func TestLoadFileRefusesOpenModes(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "auth.json")
	if err := os.WriteFile(path, []byte(`{"auths": {"r.example": {"auth": "`+auth("u", "p")+`"}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(path, 0o644)
	if _, err := LoadFile(path); err == nil || !strings.Contains(err.Error(), "mode 0644") || !strings.Contains(err.Error(), "0600") {
		t.Errorf("LoadFile of a 0644 file: %v, want a refusal naming the mode", err)
	}
	os.Chmod(path, 0o600)
	k, err := LoadFile(path)
	if err != nil || len(k.Lookup("r.example/x")) != 1 {
		t.Errorf("LoadFile of a 0600 file: %v", err)
	}
	if _, err := LoadFile(filepath.Join(dir, "missing.json")); err == nil || !strings.Contains(err.Error(), "registryAuthFile") {
		t.Errorf("missing file: %v", err)
	}
}
