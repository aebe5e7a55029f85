package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ErrNotFound is matched (errors.Is) by client errors for objects the agent
// does not have.
var ErrNotFound = errors.New("not found")

// StatusError is a non-2xx answer from the agent. Its message is the
// agent's own (e.g. "pod default/x not found").
type StatusError struct {
	Status metav1.Status
}

func (e *StatusError) Error() string { return e.Status.Message }

// Is makes errors.Is(err, ErrNotFound) true for 404 answers.
func (e *StatusError) Is(target error) bool {
	return target == ErrNotFound && e.Status.Code == http.StatusNotFound
}

// Client talks to an agent's API over its unix socket.
type Client struct {
	socketPath string
	hc         *http.Client
}

// unixHost is the placeholder host in request URLs; the transport ignores
// it and always dials the socket.
const unixHost = "mqlet"

// NewClient returns a client for the agent listening on socketPath.
func NewClient(socketPath string) *Client {
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", socketPath)
		if err != nil {
			return nil, &unreachableError{socketPath: socketPath, err: err}
		}
		return conn, nil
	}
	return &Client{
		socketPath: socketPath,
		hc: &http.Client{
			Transport: &http.Transport{DialContext: dial, MaxIdleConns: 2},
			Timeout:   10 * time.Second,
		},
	}
}

// unreachableError marks a failure to connect at all, which is nearly always
// "the agent is not running" or "wrong socket path", so it says so.
type unreachableError struct {
	socketPath string
	err        error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot reach the mqlet agent at %s (is \"mqlet agent\" running? use --api-socket): %v", e.socketPath, e.err)
}

func (e *unreachableError) Unwrap() error { return e.err }

// ListPods returns the agent's pods, sorted by namespace/name; namespace ""
// means all namespaces.
func (c *Client) ListPods(ctx context.Context, namespace string) (*v1.PodList, error) {
	path := "/api/v1/pods"
	if namespace != "" {
		path += "?namespace=" + url.QueryEscape(namespace)
	}
	var list v1.PodList
	if err := c.getJSON(ctx, path, &list); err != nil {
		return nil, err
	}
	return &list, nil
}

// GetPod returns one pod; an unknown pod gives an error matching ErrNotFound.
func (c *Client) GetPod(ctx context.Context, namespace, name string) (*v1.Pod, error) {
	var pod v1.Pod
	path := "/api/v1/namespaces/" + url.PathEscape(namespace) + "/pods/" + url.PathEscape(name)
	if err := c.getJSON(ctx, path, &pod); err != nil {
		return nil, err
	}
	return &pod, nil
}

// ListNodes returns the node the agent is, as a list (empty until the agent has computed its
// status).
func (c *Client) ListNodes(ctx context.Context) (*v1.NodeList, error) {
	var list v1.NodeList
	if err := c.getJSON(ctx, "/api/v1/nodes", &list); err != nil {
		return nil, err
	}
	return &list, nil
}

// GetNode returns the node's status; another name gives an error matching ErrNotFound.
func (c *Client) GetNode(ctx context.Context, name string) (*v1.Node, error) {
	var n v1.Node
	if err := c.getJSON(ctx, "/api/v1/nodes/"+url.PathEscape(name), &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// Rejected returns what the agent refused (manifests, messages), with the reasons.
func (c *Client) Rejected(ctx context.Context) ([]Rejected, error) {
	var list RejectedList
	if err := c.getJSON(ctx, "/api/v1/rejected", &list); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// Ready returns nil when the agent reports ready, else the agent's reason.
func (c *Client) Ready(ctx context.Context) error {
	resp, err := c.get(ctx, "/readyz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return fmt.Errorf("reading /readyz from mqlet agent at %s: %w", c.socketPath, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("mqlet agent at %s is not ready (%s): %s", c.socketPath, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

func (c *Client) get(ctx context.Context, path string) (*http.Response, error) {
	return c.getWith(c.hc, ctx, path)
}

func (c *Client) getWith(hc *http.Client, ctx context.Context, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+unixHost+path, nil)
	if err != nil {
		return nil, fmt.Errorf("building request for %s: %w", path, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		var ue *unreachableError
		if errors.As(err, &ue) {
			return nil, ue // the url.Error wrapper would only repeat the fake host
		}
		return nil, fmt.Errorf("GET %s from mqlet agent at %s: %w", path, c.socketPath, err)
	}
	return resp, nil
}

func (c *Client) getJSON(ctx context.Context, path string, into any) error {
	resp, err := c.get(ctx, path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("reading GET %s from mqlet agent at %s: %w", path, c.socketPath, err)
	}
	if resp.StatusCode != http.StatusOK {
		var st metav1.Status
		if json.Unmarshal(body, &st) != nil || st.Kind != "Status" {
			// Not one of ours (an old agent or something else on the
			// socket): keep the raw answer for the user.
			st = metav1.Status{Code: int32(resp.StatusCode),
				Message: fmt.Sprintf("GET %s from mqlet agent at %s: %s: %s", path, c.socketPath, resp.Status, strings.TrimSpace(string(body)))}
		}
		if st.Code == 0 {
			st.Code = int32(resp.StatusCode)
		}
		return &StatusError{Status: st}
	}
	if err := json.Unmarshal(body, into); err != nil {
		return fmt.Errorf("decoding GET %s from mqlet agent at %s: %w", path, c.socketPath, err)
	}
	return nil
}

// LogOptions select what Logs streams.
type LogOptions struct {
	Container string
	Previous  bool
	Follow    bool
	// TailLines, when set, is how many of the last lines to show (0: none, only what follows).
	TailLines *int64
	// Since, when positive, shows only lines newer than that (rounded up to whole seconds).
	Since time.Duration
	// SinceTime, when set, shows only lines stamped at or after it (whole seconds, as the API
	// takes it); at most one of Since and SinceTime.
	SinceTime  time.Time
	Timestamps bool
}

// Logs copies a container's log to w; with Follow it returns only when ctx ends.
func (c *Client) Logs(ctx context.Context, namespace, name string, o LogOptions, w io.Writer) error {
	q := url.Values{}
	if o.Container != "" {
		q.Set("container", o.Container)
	}
	if o.Previous {
		q.Set("previous", "true")
	}
	if o.Follow {
		q.Set("follow", "true")
	}
	if o.TailLines != nil {
		q.Set("tailLines", strconv.FormatInt(*o.TailLines, 10))
	}
	if o.Since > 0 {
		q.Set("sinceSeconds", strconv.FormatInt(int64((o.Since+time.Second-1)/time.Second), 10))
	}
	if !o.SinceTime.IsZero() {
		q.Set("sinceTime", o.SinceTime.UTC().Format(time.RFC3339))
	}
	if o.Timestamps {
		q.Set("timestamps", "true")
	}
	path := "/api/v1/namespaces/" + url.PathEscape(namespace) + "/pods/" + url.PathEscape(name) + "/log?" + q.Encode()
	hc := c.hc
	if o.Follow {
		// A followed log streams for as long as the user watches: no overall timeout.
		unbounded := *c.hc
		unbounded.Timeout = 0
		hc = &unbounded
	}
	resp, err := c.getWith(hc, ctx, path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var st metav1.Status
		if json.Unmarshal(body, &st) == nil && st.Message != "" {
			return &StatusError{Status: st}
		}
		return fmt.Errorf("logs of pod %s/%s from mqlet agent at %s: %s", namespace, name, c.socketPath, resp.Status)
	}
	_, err = io.Copy(w, resp.Body)
	if ctx.Err() != nil {
		return nil
	}
	return err
}
