package kubeletapi

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// User is an authenticated client.
type User struct {
	Name   string
	UID    string
	Groups []string
	Extra  map[string][]string
}

// Attributes are what a request asks of a node, in the API's terms (kubelet's mapping): verb on
// nodes/<Subresource> named Node.
type Attributes struct {
	Verb        string
	Subresource string
	Node        string
}

// RequestAttributes maps a request to the node's kubelet API onto the API's authorization
// attributes as kubelet does: the verb from the HTTP method, the subresource from the path
// (/stats -> stats, /metrics -> metrics, /logs -> log, /spec -> spec, /checkpoint -> checkpoint,
// anything else, /containerLogs, /exec, /attach, /portForward, /run and /pods included -> proxy).
func RequestAttributes(method, path, node string) Attributes {
	a := Attributes{Verb: verbOf(method), Subresource: "proxy", Node: node}
	switch {
	case isSubpath(path, "/stats"):
		a.Subresource = "stats"
	case isSubpath(path, "/metrics"):
		a.Subresource = "metrics"
	case isSubpath(path, "/logs"):
		a.Subresource = "log"
	case isSubpath(path, "/spec"):
		a.Subresource = "spec"
	case isSubpath(path, "/checkpoint"):
		a.Subresource = "checkpoint"
	}
	return a
}

// verbOf is kubelet's HTTP method -> API verb mapping; a method it does not list gets no verb,
// which no RBAC rule grants (but a "*" one).
func verbOf(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead:
		return "get"
	case http.MethodPost:
		return "create"
	case http.MethodPut:
		return "update"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		return "delete"
	}
	return ""
}

// isSubpath reports whether path is prefix or below it ("/stats" matches /stats and /stats/summary,
// not /statsfoo).
func isSubpath(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// errUnauthenticated is a request without valid credentials (401).
var errUnauthenticated = errors.New("unauthenticated")

// Auth authenticates clients by certificate (against ClientCAs) or bearer token (TokenReview) and
// authorizes them with SubjectAccessReview, as a kubelet with webhook authn/authz does.
type Auth struct {
	// ClientCAs verify client certificates; nil: certificates are not accepted.
	ClientCAs *x509.CertPool
	// Kube makes the TokenReviews and SubjectAccessReviews; nil: tokens are not accepted and
	// every request is denied.
	Kube kubernetes.Interface
	// Now is the clock of the caches (default time.Now).
	Now func() time.Time

	// Answers are cached as kubelet's webhook authenticator and authorizer cache them (2 min for
	// an authenticated token; 5 min for an allowed request, 30 s for a denied one), so that
	// metrics-server's scrapes and a followed log's client do not cost two API calls each.
	mu     sync.Mutex
	tokens map[[32]byte]cached[*User]
	allow  map[string]cached[decision]
}

// Cache lifetimes (kubelet's defaults) and the most entries a cache keeps.
const (
	tokenTTL      = 2 * time.Minute
	allowedTTL    = 5 * time.Minute
	deniedTTL     = 30 * time.Second
	maxCacheItems = 4096
)

type cached[T any] struct {
	v       T
	expires time.Time
}

type decision struct {
	allowed bool
	reason  string
}

func (a *Auth) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// lookup returns m[k] while it has not expired. a.mu held.
func lookup[K comparable, T any](m map[K]cached[T], k K, now time.Time) (T, bool) {
	c, ok := m[k]
	if !ok || !now.Before(c.expires) {
		var zero T
		return zero, false
	}
	return c.v, true
}

// store puts v in *m for ttl; a full cache drops its expired entries, and all of them if none has.
// a.mu held.
func store[K comparable, T any](m *map[K]cached[T], k K, v T, ttl time.Duration, now time.Time) {
	if *m == nil {
		*m = map[K]cached[T]{}
	}
	if len(*m) >= maxCacheItems {
		for key, c := range *m {
			if !now.Before(c.expires) {
				delete(*m, key)
			}
		}
		if len(*m) >= maxCacheItems {
			clear(*m)
		}
	}
	(*m)[k] = cached[T]{v: v, expires: now.Add(ttl)}
}

// Authenticate returns the request's user: the verified client certificate's (CN the name, O the
// groups), else the bearer token's per TokenReview. A certificate that does not verify is an
// error, not a fallback to the token: the client meant to be someone.
func (a *Auth) Authenticate(ctx context.Context, r *http.Request) (*User, error) {
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		if a.ClientCAs == nil {
			return nil, fmt.Errorf("%w: client certificates are not accepted (no --kubelet-client-ca)", errUnauthenticated)
		}
		leaf := r.TLS.PeerCertificates[0]
		inter := x509.NewCertPool()
		for _, c := range r.TLS.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: a.ClientCAs, Intermediates: inter,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			return nil, fmt.Errorf("%w: client certificate %q: %v", errUnauthenticated, leaf.Subject.CommonName, err)
		}
		return &User{Name: leaf.Subject.CommonName, Groups: leaf.Subject.Organization}, nil
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || strings.TrimSpace(token) == "" {
		return nil, fmt.Errorf("%w: no client certificate and no bearer token", errUnauthenticated)
	}
	if a.Kube == nil {
		return nil, fmt.Errorf("%w: bearer tokens are not accepted", errUnauthenticated)
	}
	token = strings.TrimSpace(token)
	key := sha256.Sum256([]byte(token)) // the cache holds no token
	a.mu.Lock()
	u, ok := lookup(a.tokens, key, a.now())
	a.mu.Unlock()
	if ok {
		return u, nil
	}
	tr, err := a.Kube.AuthenticationV1().TokenReviews().Create(ctx,
		&authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token review: %w", err)
	}
	if !tr.Status.Authenticated {
		msg := tr.Status.Error
		if msg == "" {
			msg = "token not authenticated"
		}
		return nil, fmt.Errorf("%w: %s", errUnauthenticated, msg)
	}
	tu := tr.Status.User
	extra := map[string][]string{}
	for k, v := range tu.Extra {
		extra[k] = v
	}
	u = &User{Name: tu.Username, UID: tu.UID, Groups: tu.Groups, Extra: extra}
	a.mu.Lock()
	store(&a.tokens, key, u, tokenTTL, a.now())
	a.mu.Unlock()
	return u, nil
}

// Authorize asks the API whether u may do at; the reason comes back for a denial.
func (a *Auth) Authorize(ctx context.Context, u *User, at Attributes) (allowed bool, reason string, err error) {
	if a.Kube == nil {
		return false, "no Kubernetes client to authorize with", nil
	}
	key, err := json.Marshal([]any{u, at})
	if err != nil {
		return false, "", err
	}
	a.mu.Lock()
	d, ok := lookup(a.allow, string(key), a.now())
	a.mu.Unlock()
	if ok {
		return d.allowed, d.reason, nil
	}
	extra := map[string]authzv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = v
	}
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: u.Name, UID: u.UID, Groups: u.Groups, Extra: extra,
		ResourceAttributes: &authzv1.ResourceAttributes{
			Verb: at.Verb, Version: "v1", Resource: "nodes", Subresource: at.Subresource, Name: at.Node,
		},
	}}
	out, err := a.Kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return false, "", fmt.Errorf("subject access review: %w", err)
	}
	d = decision{allowed: out.Status.Allowed && !out.Status.Denied, reason: out.Status.Reason}
	ttl := allowedTTL
	if !d.allowed {
		ttl = deniedTTL
	}
	a.mu.Lock()
	store(&a.allow, string(key), d, ttl, a.now())
	a.mu.Unlock()
	return d.allowed, d.reason, nil
}
