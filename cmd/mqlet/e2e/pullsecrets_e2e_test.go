package e2e

// imagePullSecrets and the node-wide registryAuthFile against a real registry that asks for a
// password: a second instance of Debian's docker-registry with htpasswd auth, serving the test
// registry's storage read-only on its own loopback port, stopped by pid.

import (
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/testenv"
	v1 "k8s.io/api/core/v1"
)

const (
	authUser = "mqlet"
	authPass = "mqlet-test-pass"
	// authHash is bcrypt(authPass), cost 4, made once with crypt(3): the registry's htpasswd
	// takes bcrypt only, and a hash in the test needs no bcrypt package in the module.
	authHash = "$2b$04$5gGU405Go20IQJa318G.nupeRsyPy0uY0SAjt8i5n2JIuN1hVfRdy"
)

// startAuthRegistry runs a registry that needs authUser/authPass and serves the test registry's
// images read-only. It returns its host:port.
func startAuthRegistry(t *testing.T) string {
	t.Helper()
	for _, need := range []string{registryBinary, registryStorage} { // as in tls_e2e_test.go
		if _, err := os.Stat(need); err != nil {
			t.Fatalf("%s is needed for the registry auth test: %v (scripts/testenv.sh installs Debian's docker-registry)", need, err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	htpasswd := filepath.Join(dir, "htpasswd")
	if err := os.WriteFile(htpasswd, []byte(authUser+":"+authHash+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "registry.yml")
	err = os.WriteFile(conf, []byte(fmt.Sprintf(`version: 0.1
log: {level: warn}
storage:
  filesystem: {rootdirectory: %s}
  maintenance:
    uploadpurging: {enabled: false}
    readonly: {enabled: true}
http:
  addr: %s
  secret: mqlet-test-auth-registry
auth:
  htpasswd: {realm: mqlet-test, path: %s}
`, registryStorage, addr, htpasswd)), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	log := &syncBuffer{}
	cmd := exec.Command(registryBinary, "serve", conf)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill() // our own process, by pid
		cmd.Wait()
		if t.Failed() {
			t.Logf("auth registry log:\n%s", log)
		}
	})
	waitFor(t, "the auth registry to listen on "+addr, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr
}

func dockerConfig(host, user, pass string) string {
	return fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, host, base64.StdEncoding.EncodeToString([]byte(user+":"+pass)))
}

func pullPod(name, image string, secrets ...string) string {
	s := `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: "` + image + `", imagePullPolicy: Always, command: ["sleep", "3600"]}
`
	if len(secrets) > 0 {
		s += "  imagePullSecrets:\n"
		for _, n := range secrets {
			s += "  - {name: " + n + "}\n"
		}
	}
	return s
}

func pullFailed(p *v1.Pod) bool {
	w := containerStatus(p, "c").State.Waiting
	return w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff")
}

// A registry that wants a password: a pod without credentials cannot pull; one whose
// imagePullSecret holds them can, one with a wrong password cannot. The node-wide registryAuthFile
// is refused at start while others may read it, and lets every pod pull once it is 0600. No
// password shows in statuses or the agent's log.
func TestImagePullSecretsAndRegistryAuthFile(t *testing.T) {
	h := newHarness(t)
	host := startAuthRegistry(t)
	image := host + "/" + testenv.RegistryBusybox
	secret := func(name, user, pass string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: %s}
type: kubernetes.io/dockerconfigjson
data: {.dockerconfigjson: %s}
`, name, base64.StdEncoding.EncodeToString([]byte(dockerConfig(host, user, pass))))
	}
	h.writeManifest("secrets.yaml", secret("good", authUser, authPass)+"---\n"+secret("bad", authUser, "wrong-pass"))
	h.writeManifest("anon.yaml", pullPod("anon", image))
	h.writeManifest("good.yaml", pullPod("withsecret", image, "missing", "good")) // a missing secret is skipped
	h.writeManifest("bad.yaml", pullPod("badsecret", image, "bad"))
	h.startAgent("--plain-http-registry", host)

	h.waitPod("withsecret", "running with its imagePullSecret", allRunning)
	for _, name := range []string{"anon", "badsecret"} {
		p := h.waitPod(name, "refused by the registry", pullFailed)
		if msg := containerStatus(p, "c").State.Waiting.Message; strings.Contains(msg, authPass) || strings.Contains(msg, "wrong-pass") {
			t.Errorf("%s: the waiting message shows a password: %s", name, msg)
		}
	}
	h.stopAgent()
	for _, pass := range []string{authPass, "wrong-pass", base64.StdEncoding.EncodeToString([]byte(authUser + ":" + authPass))} {
		if strings.Contains(h.agentLog.String(), pass) {
			t.Errorf("the agent's log shows a credential")
		}
	}

	// The node's file: refused while others may read it.
	authFile := filepath.Join(h.dir, "registry-auth.json")
	if err := os.WriteFile(authFile, []byte(dockerConfig(host, authUser, authPass)), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(authFile, 0o644)
	cmd := exec.Command(h.bin, append(append([]string{"agent"}, h.flags()...), "--plain-http-registry", host, "--registry-auth-file", authFile)...)
	out, err := runBounded(cmd, 30*time.Second)
	if err == nil || !strings.Contains(out, "registryAuthFile "+authFile+": mode 0644") || !strings.Contains(out, "0600") {
		t.Errorf("agent with a 0644 registryAuthFile: err=%v, output:\n%s", err, out)
	}
	if err := os.Chmod(authFile, 0o600); err != nil {
		t.Fatal(err)
	}
	h.startAgent("--plain-http-registry", host, "--registry-auth-file", authFile)
	h.waitPod("anon", "running with the node's credentials", allRunning)
	// The pod's own (wrong) secret is tried first, then the node's file.
	h.waitPod("badsecret", "running with the node's credentials after its own were refused", allRunning)
}

// runBounded runs cmd to its end, killing it (by pid) after limit.
func runBounded(cmd *exec.Cmd, limit time.Duration) (string, error) {
	buf := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = buf, buf
	if err := cmd.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return buf.String(), err
	case <-time.After(limit):
		cmd.Process.Kill()
		<-done
		return buf.String(), fmt.Errorf("still running after %s", limit)
	}
}
