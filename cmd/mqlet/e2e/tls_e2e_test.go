package e2e

// End-to-end test of pulling from a TLS registry whose certificate is signed by a private CA:
// with --registry-ca-file the pull works, without it the pod reports a certificate error.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
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
	registryBinary = "/usr/bin/docker-registry"
	// registryStorage is the storage root of the plain test registry (LIB_DIR/registry in
	// scripts/testenv.sh). The TLS registry serves the same blobs, so no push is needed.
	registryStorage = "/var/lib/mqlet-test/registry"
)

func TestTLSRegistry(t *testing.T) {
	testenv.Require(t)
	if _, err := os.Stat(registryBinary); err != nil {
		t.Fatalf("%s is needed for the TLS registry test: %v (scripts/testenv.sh installs Debian's docker-registry)", registryBinary, err)
	}
	if _, err := os.Stat(filepath.Join(registryStorage, "docker", "registry", "v2", "repositories", "mqlet", "busybox")); err != nil {
		t.Fatalf("the test registry's storage lacks mqlet/busybox: %v (run scripts/testenv.sh)", err)
	}
	dir := t.TempDir()
	caFile, certFile, keyFile := writeTestPKI(t, dir)
	addr := startTLSRegistry(t, dir, caFile, certFile, keyFile)
	ref := addr + "/" + testenv.RegistryBusybox
	manifest := `apiVersion: v1
kind: Pod
metadata: {name: tls}
spec:
  containers:
  - name: main
    image: ` + ref + `
    imagePullPolicy: Always
    command: ["sleep", "3600"]
`

	t.Run("with CA", func(t *testing.T) {
		h := newHarness(t)
		h.writeManifest("tls.yaml", manifest)
		h.startAgent("--registry-ca-file", caFile)
		p := h.waitPod("tls", "running", allRunning)
		if id, want := containerStatus(p, "main").ImageID, addr+"/mqlet/busybox@sha256:"; !strings.Contains(id, want) {
			t.Errorf("imageID %q does not contain %q", id, want)
		}
	})

	t.Run("without CA", func(t *testing.T) {
		h := newHarness(t)
		h.writeManifest("tls.yaml", manifest)
		h.startAgent()
		p := h.waitPod("tls", "failing to pull", func(p *v1.Pod) bool {
			w := containerStatus(p, "main").State.Waiting
			return w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff")
		})
		w := containerStatus(p, "main").State.Waiting
		if !strings.Contains(w.Message, "x509") && !strings.Contains(w.Message, "certificate") {
			t.Errorf("pull failure message does not name the certificate problem: %s: %s", w.Reason, w.Message)
		}
		if !strings.Contains(w.Message, addr) {
			t.Errorf("pull failure message does not name the registry %s: %s", addr, w.Message)
		}
		if p.Status.Phase != v1.PodPending {
			t.Errorf("phase %s, want Pending", p.Status.Phase)
		}
	})

	// imagePullPolicy Always falls back to a local copy only when the registry cannot be reached;
	// a registry that answers with a certificate nobody trusts is an error to show, not to hide.
	t.Run("without CA, with a local copy", func(t *testing.T) {
		h := newHarness(t)
		h.tagBusybox(ref)
		h.writeManifest("tls.yaml", manifest)
		h.startAgent()
		p := h.waitPod("tls", "failing to pull despite the local copy", func(p *v1.Pod) bool {
			w := containerStatus(p, "main").State.Waiting
			return w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff")
		})
		if w := containerStatus(p, "main").State.Waiting; !strings.Contains(w.Message, "certificate") {
			t.Errorf("pull failure message does not name the certificate problem: %s: %s", w.Reason, w.Message)
		}
		if strings.Contains(h.agentLog.String(), "using the local copy") {
			t.Errorf("the local copy was used although the registry answered:\n%s", h.agentLog)
		}
	})
}

// writeTestPKI writes a throwaway CA and a server certificate for 127.0.0.1 and localhost,
// signed by it, as PEM files in dir.
func writeTestPKI(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	// Backdate a little so a clock that is slightly off does not make the certificates invalid.
	notBefore := time.Now().Add(-time.Hour)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "mqlet test CA"},
		NotBefore:             notBefore,
		NotAfter:              notBefore.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}

	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    notBefore,
		NotAfter:     notBefore.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srvKeyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}

	caFile = filepath.Join(dir, "ca.pem")
	certFile = filepath.Join(dir, "server.pem")
	keyFile = filepath.Join(dir, "server-key.pem")
	for _, f := range []struct {
		path, typ string
		der       []byte
	}{
		{caFile, "CERTIFICATE", caDER},
		{certFile, "CERTIFICATE", srvDER},
		{keyFile, "EC PRIVATE KEY", srvKeyDER},
	} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return caFile, certFile, keyFile
}

// startTLSRegistry runs a second docker-registry over TLS on a free loopback port, serving the
// plain test registry's storage read-only, and returns its host:port once it answers.
func startTLSRegistry(t *testing.T, dir, caFile, certFile, keyFile string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	// Read-only mode and no upload purging: the storage belongs to the plain registry, and this
	// one must not change it. No http.debug section, so no second listener to clash with.
	cfg := filepath.Join(dir, "registry.yml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`version: 0.1
log:
  level: info
  fields:
    service: mqlet-test-tls-registry
storage:
  filesystem:
    rootdirectory: %s
  maintenance:
    uploadpurging:
      enabled: false
    readonly:
      enabled: true
http:
  addr: %s
  secret: mqlet-test-tls-registry
  tls:
    certificate: %s
    key: %s
`, registryStorage, addr, certFile, keyFile)), 0o600); err != nil {
		t.Fatal(err)
	}

	// A file, not a buffer, so the log can be read while the registry still writes to it.
	logPath := filepath.Join(dir, "registry.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	regLog := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	cmd := exec.Command(registryBinary, "serve", cfg)
	// REGISTRY_* variables override the config file; keep any in our environment out of it.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "REGISTRY_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s serve %s: %v", registryBinary, cfg, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("TLS registry log:\n%s", regLog())
		}
	})

	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	defer client.CloseIdleConnections()
	url := "https://" + addr + "/v2/"
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return addr
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		select {
		case werr := <-exited:
			// Put it back for the cleanup, which waits on it.
			exited <- werr
			t.Fatalf("TLS registry on %s exited at start: %v\n%s", addr, werr, regLog())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("TLS registry: GET %s: no answer within 10s: %v\n%s", url, err, regLog())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
