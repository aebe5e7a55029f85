package pods

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/mqlet/mqlet/core/satoken"
	authnv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// Service account tokens (docs/kubernetes.md, "Service account tokens").
//
// kubelet asks the TokenRequest API for every serviceAccountToken projection of its pods and
// writes the token into the projected volume. A node here has no API credentials, so the bridge
// asks for it: each projection becomes, in the pod the node gets, a projection of one key of a
// Secret the bridge makes up (tokenSecretName), and that Secret travels sealed to the node's key
// like any other. The token is bound to the pod (it stops working when the pod is deleted) and is
// asked for again, and the Secret re-sent, once 80 % of its lifetime has passed (or
// DefaultTokenMaxAge, whichever comes first), as kubelet does; a node that is offline keeps the
// token it has until it expires, as the API server said.

// tokenKey names the Secret that carries the token: a constant prefix, the pod's UID (so two pods
// never share one, and a pod made again under the same name gets its own) and the projection's
// place in the pod.
const tokenSecretPrefix = satoken.NamePrefix

// tokenDataKey is the key of the token in that Secret.
const tokenDataKey = "token"

// DefaultTokenMaxAge is the age after which a token is renewed even when its lifetime is longer
// (the API server extends the admission plugin's 1 h tokens to a year for old clients; kubelet
// renews after a day at the latest, and so does the bridge).
const DefaultTokenMaxAge = 24 * time.Hour

// tokenRetry is how soon a failed TokenRequest is asked again: each sync of the node would ask
// otherwise, and an API server that refuses (no such ServiceAccount yet) would be asked in a loop.
const tokenRetry = 10 * time.Second

// defaultTokenExpiration is what the API defaults a projection's expirationSeconds to.
const defaultTokenExpiration = 3600

func tokenSecretName(uid types.UID, vol, src int) string {
	return fmt.Sprintf("%s%s-%d-%d", tokenSecretPrefix, uid, vol, src)
}

// tokenID is one token the bridge holds: one pod's, for one audience and lifetime.
type tokenID struct {
	uid      types.UID
	audience string
	seconds  int64
}

type tokenEntry struct {
	token           string
	issued, expires time.Time
	failed          time.Time // the last failed request, zero when the last one worked
	err             error
}

// tokens caches the tokens of the pods of every node, so that a node's sync asks the API only for
// a token that is new or due for renewal. Guarded by mu; the API is never asked with mu held.
type tokens struct {
	kube   kubernetes.Interface
	maxAge time.Duration
	now    func() time.Time

	mu     sync.Mutex
	byNode map[string]map[tokenID]*tokenEntry
}

func newTokens(kube kubernetes.Interface, maxAge time.Duration) *tokens {
	if maxAge <= 0 {
		maxAge = DefaultTokenMaxAge
	}
	return &tokens{kube: kube, maxAge: maxAge, now: time.Now, byNode: map[string]map[tokenID]*tokenEntry{}}
}

// renewAt is when a token issued at issued, valid until expires, is asked for again.
func (t *tokens) renewAt(e *tokenEntry) time.Time {
	at := e.issued.Add(e.expires.Sub(e.issued) * 8 / 10)
	if limit := e.issued.Add(t.maxAge); limit.Before(at) {
		at = limit
	}
	return at
}

// get returns the token of pod p for projection s, asking the API for one when none is cached or
// the cached one is due for renewal.
func (t *tokens) get(ctx context.Context, node string, p *v1.Pod, s *v1.ServiceAccountTokenProjection) (string, error) {
	id := tokenID{uid: p.UID, audience: s.Audience, seconds: defaultTokenExpiration}
	if s.ExpirationSeconds != nil {
		id.seconds = *s.ExpirationSeconds
	}
	now := t.now()
	t.mu.Lock()
	e := t.byNode[node][id]
	t.mu.Unlock()
	if e != nil {
		switch {
		case e.err != nil && now.Sub(e.failed) < tokenRetry:
			if e.token != "" && now.Before(e.expires) {
				return e.token, nil // the renewal failed; the node's token still works
			}
			return "", e.err
		case e.err == nil && now.Before(t.renewAt(e)):
			return e.token, nil
		}
	}
	sa := p.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	req := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		ExpirationSeconds: &id.seconds,
		BoundObjectRef:    &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
	}}
	if s.Audience != "" {
		req.Spec.Audiences = []string{s.Audience}
	}
	got, err := t.kube.CoreV1().ServiceAccounts(p.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	n := &tokenEntry{issued: now}
	switch {
	case err != nil:
		n.err = fmt.Errorf("token of service account %s/%s for pod %s: %w", p.Namespace, sa, p.Name, err)
	case got.Status.Token == "":
		n.err = fmt.Errorf("token of service account %s/%s for pod %s: the API returned no token", p.Namespace, sa, p.Name)
	default:
		n.token, n.expires = got.Status.Token, got.Status.ExpirationTimestamp.Time
		if !n.expires.After(now) { // a clock apart from the API server's: renew at the next check
			n.expires = now
		}
	}
	if n.err != nil {
		n.failed = now
		if e != nil && e.err == nil && now.Before(e.expires) {
			// The token the node has still works: keep sending it, and ask again later.
			n.token, n.issued, n.expires = e.token, e.issued, e.expires
		}
	}
	t.mu.Lock()
	m := t.byNode[node]
	if m == nil {
		m = map[tokenID]*tokenEntry{}
		t.byNode[node] = m
	}
	m[id] = n
	t.mu.Unlock()
	if n.token != "" {
		return n.token, nil
	}
	return "", n.err
}

// retain forgets the tokens of node's pods that are not in uids (deleted, or moved away).
func (t *tokens) retain(node string, uids map[types.UID]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.byNode[node]
	for id := range m {
		if !uids[id.uid] {
			delete(m, id)
		}
	}
	if len(m) == 0 {
		delete(t.byNode, node)
	}
}

// forget drops every token of node (no longer served).
func (t *tokens) forget(node string) {
	t.mu.Lock()
	delete(t.byNode, node)
	t.mu.Unlock()
}

// due lists the nodes holding a token to renew (or a failed one to ask again) by now.
func (t *tokens) due(now time.Time) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for node, m := range t.byNode {
		for _, e := range m {
			if e.err != nil && now.Sub(e.failed) >= tokenRetry || e.err == nil && !now.Before(t.renewAt(e)) {
				out = append(out, node)
				break
			}
		}
	}
	return out
}

// checkEvery is how often Run looks for tokens due: often enough that none is renewed much past
// its 80 %, and at least every tokenRetry for failed ones.
func (t *tokens) checkEvery() time.Duration {
	d := min(t.maxAge/4, tokenRetry)
	return max(d, 100*time.Millisecond)
}

// withTokens turns every serviceAccountToken projection of sp (the pod as the node gets it; p is
// the API's) into a projection of the token key of a Secret made for it, and returns those
// Secrets, each holding a token from the API. A token that cannot be had is left out (the node
// waits for its Secret, as kubelet waits for a volume it cannot set up); its error is returned by
// Secret name.
func (c *Controller) withTokens(ctx context.Context, node string, sp, p *v1.Pod) ([]*v1.Secret, map[string]error) {
	var out []*v1.Secret
	var errs map[string]error
	for i := range sp.Spec.Volumes {
		v := &sp.Spec.Volumes[i]
		if v.Projected == nil {
			continue
		}
		for j := range v.Projected.Sources {
			s := &v.Projected.Sources[j]
			if s.ServiceAccountToken == nil {
				continue
			}
			name := tokenSecretName(p.UID, i, j)
			tok, err := c.tokens.get(ctx, node, p, s.ServiceAccountToken)
			path := s.ServiceAccountToken.Path
			*s = v1.VolumeProjection{Secret: &v1.SecretProjection{
				LocalObjectReference: v1.LocalObjectReference{Name: name},
				Items:                []v1.KeyToPath{{Key: tokenDataKey, Path: path}},
			}}
			if err != nil {
				if errs == nil {
					errs = map[string]error{}
				}
				errs[name] = err
				continue
			}
			out = append(out, &v1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: name,
					Labels:      map[string]string{"mqlet.io/service-account-token": "true"},
					Annotations: map[string]string{satoken.AnnotationPodUID: string(p.UID)}},
				Type: v1.SecretTypeOpaque,
				Data: map[string][]byte{tokenDataKey: []byte(tok)},
			})
		}
	}
	return out, errs
}
