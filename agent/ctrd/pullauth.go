package ctrd

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/distribution/reference"
	"github.com/mqlet/mqlet/agent/regauth"
	v1 "k8s.io/api/core/v1"
)

// SetNodeCredentials sets the node-wide registry credentials (registryAuthFile), tried after the
// pod's imagePullSecrets. Call it before any container starts.
func (r *Runtime) SetNodeCredentials(k *regauth.Keyring) { r.nodeAuth = k }

type pullAuthKey struct{}

// withPullSecrets attaches to ctx the keyrings an image pull for pod may use: the pod's
// imagePullSecrets in order, then the node's file. A secret that is missing or not a registry
// credential is skipped with a warning and the pull goes on without it, as kubelet does.
func (r *Runtime) withPullSecrets(ctx context.Context, pod *v1.Pod) context.Context {
	var rings []*regauth.Keyring
	for _, ref := range pod.Spec.ImagePullSecrets {
		ring, err := r.pullSecret(pod.Namespace, ref.Name)
		if err != nil {
			r.log.Warn("imagePullSecret not usable; pulling without it", "pod", pod.Namespace+"/"+pod.Name, "secret", ref.Name, "err", err)
			continue
		}
		rings = append(rings, ring)
	}
	if r.nodeAuth != nil {
		rings = append(rings, r.nodeAuth)
	}
	if len(rings) == 0 {
		return ctx
	}
	return context.WithValue(ctx, pullAuthKey{}, rings)
}

// pullSecret reads the keyring of a Secret of type kubernetes.io/dockerconfigjson or dockercfg.
func (r *Runtime) pullSecret(namespace, name string) (*regauth.Keyring, error) {
	s, err := r.objectsOrNone().Secret(namespace, name)
	if err != nil {
		return nil, err
	}
	from := "Secret " + namespace + "/" + name
	switch s.Type {
	case v1.SecretTypeDockerConfigJson:
		return regauth.ParseConfigJSON(s.Data[v1.DockerConfigJsonKey], from)
	case v1.SecretTypeDockercfg:
		return regauth.ParseDockercfg(s.Data[v1.DockerConfigKey], from)
	}
	return nil, fmt.Errorf("%s is of type %q, not %s or %s", from, s.Type, v1.SecretTypeDockerConfigJson, v1.SecretTypeDockercfg)
}

// pullCreds are the credentials ctx carries that match ref, most specific first.
func pullCreds(ctx context.Context, ref string) []regauth.Credential {
	rings, _ := ctx.Value(pullAuthKey{}).([]*regauth.Keyring)
	return regauth.LookupAll(rings, ref)
}

// pullCredsKey tells apart pulls of one image with different credentials (by where they come
// from, never by their secret).
func pullCredsKey(ctx context.Context, ref string) string {
	var b strings.Builder
	for _, c := range pullCreds(ctx, ref) {
		b.WriteString("\x00" + c.String())
	}
	return b.String()
}

// credsFunc answers the auth challenges of ref's registry with cred, and of no other host: a
// registry may redirect blob downloads to a storage host, which must not get the password.
func credsFunc(ref string, cred *regauth.Credential) func(host string) (string, string, error) {
	if cred == nil {
		return nil
	}
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return nil
	}
	registry := reference.Domain(named)
	return func(host string) (string, string, error) {
		if host == registry || registry == "docker.io" && host == "registry-1.docker.io" {
			return cred.Username, cred.Secret, nil
		}
		return "", "", nil
	}
}

// authRefused reports whether a pull failed because the registry did not accept the credential.
func authRefused(err error) bool {
	if errors.Is(err, docker.ErrInvalidAuthorization) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "401 Unauthorized") || strings.Contains(msg, "403 Forbidden")
}
