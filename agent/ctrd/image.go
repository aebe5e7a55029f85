package ctrd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/distribution/reference"
	"github.com/mqlet/mqlet/agent/regauth"
	v1 "k8s.io/api/core/v1"
)

// RegistryOptions say how to reach registries. Credentials come from the pod's imagePullSecrets and
// the node's registryAuthFile (pullauth.go).
type RegistryOptions struct {
	PlainHTTP []string // host[:port] spoken to over plain HTTP
	CAFile    string   // extra PEM bundle trusted for TLS registries
}

// Errors that map onto kubelet's image waiting reasons.
var (
	ErrImageNeverPull = errors.New("image is not present and imagePullPolicy is Never")
	ErrInvalidImage   = errors.New("invalid image name")
)

// registryStall is how long a registry may send nothing before a pull gives up (and is retried
// with back-off). A pull has no overall deadline: a large image on a slow link is fine as long
// as bytes keep coming, but a stalled connection must not hold a pod (or its deletion) forever.
const registryStall = time.Minute

// errRegistryStalled marks a pull cut off because the registry stopped sending.
var errRegistryStalled = errors.New("registry stalled")

// stallTransport closes a response body that has delivered nothing for stall.
type stallTransport struct {
	base  http.RoundTripper
	stall time.Duration
}

func (t stallTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	b := &stallBody{rc: resp.Body, url: req.URL.Redacted(), stall: t.stall}
	b.timer = time.AfterFunc(t.stall, func() {
		b.stalled.Store(true)
		b.rc.Close()
	})
	b.timer.Stop() // armed only while a Read waits for the registry
	resp.Body = b
	return resp, nil
}

type stallBody struct {
	rc      io.ReadCloser
	url     string
	stall   time.Duration
	timer   *time.Timer
	stalled atomic.Bool
}

// Read counts only time spent waiting on the registry: a consumer slow to write what it got (an
// SD card) is not a stalled registry.
func (b *stallBody) Read(p []byte) (int, error) {
	b.timer.Reset(b.stall)
	n, err := b.rc.Read(p)
	b.timer.Stop()
	if err != nil && b.stalled.Load() {
		return n, fmt.Errorf("%w: nothing for %s on %s", errRegistryStalled, b.stall, b.url)
	}
	return n, err
}

func (b *stallBody) Close() error {
	b.timer.Stop()
	return b.rc.Close()
}

// NormalizeImage turns a pod's image into the full name containerd stores ("busybox" ->
// "docker.io/library/busybox:latest").
func NormalizeImage(image string) (string, error) {
	named, err := reference.ParseDockerRef(image)
	if err != nil {
		return "", fmt.Errorf("%w %q: %v", ErrInvalidImage, image, err)
	}
	return named.String(), nil
}

type pull struct {
	done chan struct{}
	img  containerd.Image
	err  error
}

// EnsureImage returns the image for a container, pulling it according to policy. Concurrent calls for
// one image share a single pull, so twenty pods of one image cost one download.
func (r *Runtime) EnsureImage(ctx context.Context, image string, policy v1.PullPolicy) (containerd.Image, error) {
	ref, err := NormalizeImage(image)
	if err != nil {
		return nil, err
	}
	ctx = r.ctx(ctx)
	local, lerr := r.client.GetImage(ctx, ref)
	if lerr != nil && !errdefs.IsNotFound(lerr) {
		return nil, fmt.Errorf("look up image %s: %w", ref, lerr)
	}
	switch {
	case policy == v1.PullNever && local == nil:
		return nil, fmt.Errorf("%s: %w", ref, ErrImageNeverPull)
	case policy == v1.PullAlways:
		// No overall deadline even with a local copy to fall back on: an unreachable registry
		// fails within the dial timeout (30 s) or registryStall, while a large update on a slow
		// link is allowed to finish instead of being abandoned for the old copy every time.
		img, err := r.pullNotified(ctx, image, ref)
		if err != nil && local != nil && ctx.Err() == nil && registryUnreachable(err) {
			// An edge node is often offline. kubelet would fail the pod here; we run the copy we
			// have, because a reboot without network must not take down a pod that ran before.
			// A registry that answered (a refusal, a bad certificate, no such image) is not
			// offline: hiding that behind an old copy would leave it unnoticed.
			r.log.Warn("registry unreachable; using the local copy of the image", "image", ref, "err", err)
			return local, r.unpack(ctx, local)
		}
		return img, err
	case local != nil:
		notifyPresent(ctx, image)
		return local, r.unpack(ctx, local)
	default:
		return r.pullNotified(ctx, image, ref)
	}
}

// registryUnreachable reports whether a pull failed for want of a connection to the registry (no
// route, no DNS, refused, reset or dropped, timed out, stalled) rather than because the registry,
// or something claiming to be it, answered: an authentication refusal, a certificate that does not
// verify, a TLS alert, or an unknown image.
func registryUnreachable(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		record   tls.RecordHeaderError
		dns      *net.DNSError
		op       *net.OpError
		netErr   net.Error
	)
	switch {
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &hostname),
		errors.As(err, &invalid), errors.As(err, &record):
		return false
	case errors.Is(err, errRegistryStalled), errors.As(err, &dns):
		return true
	case errors.As(err, &op):
		return op.Op != "remote error" // a TLS alert: the server answered and refused us
	case errors.As(err, &netErr) && netErr.Timeout():
		return true
	}
	for _, e := range []error{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED,
		syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.ETIMEDOUT, syscall.EPIPE, io.ErrUnexpectedEOF} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (r *Runtime) unpack(ctx context.Context, img containerd.Image) error {
	ok, err := img.IsUnpacked(ctx, r.opts.Snapshotter)
	if err != nil || ok {
		return err
	}
	if err := img.Unpack(ctx, r.opts.Snapshotter); err != nil {
		return fmt.Errorf("unpack image %s: %w", img.Name(), err)
	}
	return nil
}

func (r *Runtime) pullShared(ctx context.Context, ref string) (containerd.Image, error) {
	key := ref + pullCredsKey(ctx, ref) // pods with other credentials do not share a pull
	r.pulls.Lock()
	if p, ok := r.pulling[key]; ok {
		r.pulls.Unlock()
		select {
		case <-p.done:
			return p.img, p.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	p := &pull{done: make(chan struct{})}
	r.pulling[key] = p
	r.pulls.Unlock()

	p.img, p.err = r.Pull(ctx, ref)
	close(p.done)
	r.pulls.Lock()
	delete(r.pulling, key)
	r.pulls.Unlock()
	return p.img, p.err
}

// Pull fetches and unpacks an image from its registry, with the credentials ctx carries for it
// (withPullSecrets), trying each that matches in turn while the registry refuses them.
func (r *Runtime) Pull(ctx context.Context, ref string) (containerd.Image, error) {
	creds := pullCreds(ctx, ref)
	if len(creds) == 0 {
		return r.pullWith(ctx, ref, nil)
	}
	var err error
	for i := range creds {
		var img containerd.Image
		if img, err = r.pullWith(ctx, ref, &creds[i]); err == nil || !authRefused(err) {
			return img, err
		}
		r.log.Info("registry refused a credential", "image", ref, "credential", creds[i].String(), "err", err)
	}
	return nil, err
}

func (r *Runtime) pullWith(ctx context.Context, ref string, cred *regauth.Credential) (containerd.Image, error) {
	resolver, err := r.resolverWith(credsFunc(ref, cred))
	if err != nil {
		return nil, err
	}
	start := time.Now()
	img, err := r.client.Pull(r.ctx(ctx), ref,
		containerd.WithResolver(resolver),
		containerd.WithPullUnpack,
		containerd.WithPullSnapshotter(r.opts.Snapshotter))
	if r.opts.OnPull != nil {
		r.opts.OnPull(ref, time.Since(start), err)
	}
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", ref, err)
	}
	r.log.Info("pulled image", "image", ref, "took", time.Since(start).Round(time.Millisecond))
	return img, nil
}

func (r *Runtime) resolver() (remotes.Resolver, error) { return r.resolverWith(nil) }

// resolverWith answers registries' auth challenges with creds (nil: anonymously).
func (r *Runtime) resolverWith(creds func(host string) (string, string, error)) (remotes.Resolver, error) {
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12}
	if r.opts.Registry.CAFile != "" {
		pem, err := os.ReadFile(r.opts.Registry.CAFile)
		if err != nil {
			return nil, fmt.Errorf("registry CA file (registryCAFile) %s: %w", r.opts.Registry.CAFile, err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("registry CA file (registryCAFile) %s: no PEM certificates in it", r.opts.Registry.CAFile)
		}
		tlsConf.RootCAs = pool
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsConf
	tr.ResponseHeaderTimeout = registryStall
	plain := r.opts.Registry.PlainHTTP
	client := &http.Client{Transport: stallTransport{base: tr, stall: registryStall}}
	hosts := docker.ConfigureDefaultRegistries(
		docker.WithClient(client),
		docker.WithPlainHTTP(func(host string) (bool, error) { return slices.Contains(plain, host), nil }),
		docker.WithAuthorizer(docker.NewDockerAuthorizer(docker.WithAuthClient(client), docker.WithAuthCreds(creds))),
	)
	return docker.NewResolver(docker.ResolverOptions{Hosts: hosts}), nil
}

// ImportArchive imports a docker-archive or OCI archive into containerd and unpacks it. It returns the
// names of the images it created. OCI archives whose ref annotation is only a tag ("1.0") carry no
// repository name and are not named: use a docker-archive or a full reference in the annotation.
func (r *Runtime) ImportArchive(ctx context.Context, rd io.Reader) ([]string, error) {
	ctx = r.ctx(ctx)
	imgs, err := r.client.Import(ctx, rd,
		containerd.WithImageRefTranslator(func(name string) string {
			if !strings.ContainsAny(name, "/:") {
				return ""
			}
			n, err := NormalizeImage(name)
			if err != nil {
				return ""
			}
			return n
		}))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, i := range imgs {
		img := containerd.NewImage(r.client, i)
		if err := r.unpack(ctx, img); err != nil {
			return names, err
		}
		names = append(names, i.Name)
	}
	if len(names) == 0 {
		return nil, errors.New("the archive holds no named image (docker-archive RepoTags or OCI org.opencontainers.image.ref.name with a full reference)")
	}
	return names, nil
}

// ImageInfo is one row of `mqlet image ls`.
type ImageInfo struct {
	Name    string
	Digest  string
	Size    int64
	Created time.Time
}

// ListImages lists the images in the namespace. An image's size is computed through the content
// store once per digest (see imageSizes).
func (r *Runtime) ListImages(ctx context.Context) ([]ImageInfo, error) {
	ctx = r.ctx(ctx)
	list, err := r.client.ImageService().List(ctx)
	if err != nil {
		return nil, err
	}
	known := r.imageSizes.get()
	sizes := make(map[string]int64, len(list))
	out := make([]ImageInfo, 0, len(list))
	for _, i := range list {
		d := i.Target.Digest.String()
		size, ok := sizes[d]
		if !ok {
			size, ok = known[d]
		}
		if !ok {
			var err error
			size, err = i.Size(ctx, r.client.ContentStore(), platforms.Default())
			ok = err == nil // a size read from incomplete content is not remembered
		}
		if ok {
			sizes[d] = size
		}
		out = append(out, ImageInfo{Name: i.Name, Digest: d, Size: size, Created: i.CreatedAt})
	}
	r.imageSizes.set(sizes)
	slices.SortFunc(out, func(a, b ImageInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// imageSizes remembers the images' sizes by digest from one listing to the next. An image's
// content is immutable for its digest, and the node status lists the images every period: without
// it an idle node would read every image's manifests from the content store every 10 s. Each
// listing replaces the map, so digests of removed images go with it.
type imageSizes struct {
	mu    sync.Mutex
	sizes map[string]int64
}

// get returns the current map; callers only read it (set replaces it, never changes it).
func (c *imageSizes) get() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sizes
}

func (c *imageSizes) set(sizes map[string]int64) {
	c.mu.Lock()
	c.sizes = sizes
	c.mu.Unlock()
}

// HasImage reports whether an image of that (normalized) name exists.
func (r *Runtime) HasImage(ctx context.Context, name string) (bool, error) {
	_, err := r.client.ImageService().Get(r.ctx(ctx), name)
	if errdefs.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}
