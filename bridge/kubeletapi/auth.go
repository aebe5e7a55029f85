package kubeletapi

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"strings"

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
	tr, err := a.Kube.AuthenticationV1().TokenReviews().Create(ctx,
		&authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: strings.TrimSpace(token)}}, metav1.CreateOptions{})
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
	u := tr.Status.User
	extra := map[string][]string{}
	for k, v := range u.Extra {
		extra[k] = v
	}
	return &User{Name: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra}, nil
}

// Authorize asks the API whether u may do at; the reason comes back for a denial.
func (a *Auth) Authorize(ctx context.Context, u *User, at Attributes) (allowed bool, reason string, err error) {
	if a.Kube == nil {
		return false, "no Kubernetes client to authorize with", nil
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
	return out.Status.Allowed && !out.Status.Denied, out.Status.Reason, nil
}
