package probe

import (
	"bufio"
	"context"
	"crypto/tls"
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
)

// httpGet actions (probes and hooks) are one GET on a fresh connection, closed after the response,
// as kubelet's (keep-alives off, TLS certificates not checked). The request is written and the
// response read right here, with net/http's parser and a pooled buffer, instead of through an
// http.Transport: a transport's connection machinery (a dial goroutine, a reader and a writer
// goroutine and their buffers per connection) is most of what a probe would cost, and a probe
// every second on every pod of a small device is what has to stay cheap.

// getRequest is an httpGet action resolved against its target.
type getRequest struct {
	url    *url.URL
	host   string // Host header
	header http.Header
	route  route
}

// request resolves an httpGet action, with kubelet's User-Agent and Accept defaults.
func (p *Prober) request(t Target, h *v1.HTTPGetAction, purpose string) (*getRequest, error) {
	scheme := strings.ToLower(string(h.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	if scheme != "http" && scheme != "https" {
		return nil, fmt.Errorf("httpGet scheme %q: want HTTP or HTTPS", h.Scheme)
	}
	n, err := port(h.Port, t.Container)
	if err != nil {
		return nil, fmt.Errorf("httpGet %w", err)
	}
	host, r := p.endpoint(t, h.Host)
	u, err := url.Parse(h.Path)
	if err != nil {
		u = &url.URL{Path: h.Path}
	}
	u.Scheme, u.Host = scheme, net.JoinHostPort(host, strconv.Itoa(n))
	header := make(http.Header, len(h.HTTPHeaders)+2)
	for _, hd := range h.HTTPHeaders {
		if !validHeader(hd.Name, hd.Value) {
			return nil, fmt.Errorf("httpGet header %q: not a valid HTTP header name and value", hd.Name)
		}
		header.Add(hd.Name, hd.Value)
	}
	if _, ok := header["User-Agent"]; !ok {
		header.Set("User-Agent", p.userAgent(purpose))
	}
	if _, ok := header["Accept"]; !ok {
		header.Set("Accept", "*/*")
	} else if header.Get("Accept") == "" {
		header.Del("Accept") // set empty on purpose: send none
	}
	req := &getRequest{url: u, host: u.Host, header: header, route: r}
	if hv := header.Get("Host"); hv != "" {
		req.host = hv
	}
	header.Del("Host")
	return req, nil
}

// validHeader keeps a manifest's header from splitting the request (CR, LF) or being no header.
func validHeader(name, value string) bool {
	if name == "" {
		return false
	}
	for _, c := range name {
		if c <= ' ' || c >= 0x7f || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, c) {
			return false
		}
	}
	return !strings.ContainsAny(value, "\r\n\x00")
}

// response is what a GET got: the status and at most maxBody bytes of the body.
type response struct {
	status   int
	location string
	body     []byte
}

// roundTrip sends the GET on a new connection and reads the response; ctx bounds it all.
func (p *Prober) roundTrip(ctx context.Context, req *getRequest, withBody bool) (response, error) {
	conn, err := dialContext(withRoute(ctx, req.route), "tcp", req.url.Host)
	if err != nil {
		return response{}, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	// Closing the connection is what unblocks a read when ctx is cancelled rather than timed out.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if req.url.Scheme == "https" {
		tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true, ServerName: req.url.Hostname()})
		if err := tc.HandshakeContext(ctx); err != nil {
			return response{}, fmt.Errorf("TLS handshake with %s: %w", req.url.Host, err)
		}
		conn = tc
	}
	br, _ := p.readers.Get().(*bufio.Reader)
	if br == nil {
		br = bufio.NewReaderSize(nil, 4<<10)
	}
	defer func() { br.Reset(nil); p.readers.Put(br) }()
	bw := bufio.NewWriterSize(conn, 512)
	fmt.Fprintf(bw, "GET %s HTTP/1.1\r\nHost: %s\r\n", req.url.RequestURI(), req.host)
	req.header.Write(bw)
	bw.WriteString("Connection: close\r\n\r\n")
	if err := bw.Flush(); err != nil {
		return response{}, fmt.Errorf("GET %s: %w", req.url, err)
	}
	br.Reset(conn)
	res, err := http.ReadResponse(br, &http.Request{Method: http.MethodGet})
	if err != nil {
		return response{}, fmt.Errorf("GET %s: %w", req.url, err)
	}
	defer res.Body.Close()
	out := response{status: res.StatusCode, location: res.Header.Get("Location")}
	if withBody {
		if out.body, err = io.ReadAll(io.LimitReader(res.Body, maxBody)); err != nil {
			return response{}, fmt.Errorf("reading the response of %s: %w", req.url, err)
		}
	}
	return out, nil
}

// get runs the GET, following redirects to the same host as kubelet's probes do (up to
// maxRedirects); a redirect elsewhere is returned as the response, not followed.
func (p *Prober) get(ctx context.Context, req *getRequest, withBody bool) (response, error) {
	first := req.url.Hostname()
	for i := 0; ; i++ {
		res, err := p.roundTrip(ctx, req, withBody)
		if err != nil {
			return res, err
		}
		if res.status < 300 || res.status >= 400 || res.location == "" || res.status == http.StatusNotModified {
			return res, nil
		}
		next, err := req.url.Parse(res.location)
		if err != nil || (next.Scheme != "http" && next.Scheme != "https") || next.Hostname() != first {
			return res, nil
		}
		if i+1 >= maxRedirects {
			return res, fmt.Errorf("stopped after %d redirects", maxRedirects)
		}
		copied := *req
		copied.url = next
		if req.host == req.url.Host {
			copied.host = next.Host
		}
		req = &copied
	}
}

func (p *Prober) httpGet(ctx context.Context, t Target, h *v1.HTTPGetAction, timeout time.Duration) (Result, string, error) {
	req, err := p.request(t, h, "probe")
	if err != nil {
		return Unknown, "", err
	}
	res, err := p.get(ctx, req, true)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
			return Failure, fmt.Sprintf("GET %s: no response within %s", req.url, timeout), nil
		}
		return Failure, err.Error(), nil
	}
	switch {
	case res.status >= 200 && res.status < 300:
		return Success, string(res.body), nil
	case res.status >= 300 && res.status < 400:
		return Warning, fmt.Sprintf("probe did not follow the redirect to another host, response body: %s", res.body), nil
	}
	return Failure, fmt.Sprintf("HTTP probe failed with statuscode: %d", res.status), nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// httpHook sends a hook's GET. As in kubelet, only a request that gets no response fails; the
// status code is the application's business.
func (p *Prober) httpHook(ctx context.Context, t Target, h *v1.HTTPGetAction) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, hookHTTPTimeout)
		defer cancel()
	}
	req, err := p.request(t, h, "lifecycle")
	if err != nil {
		return err
	}
	if _, err := p.get(ctx, req, false); err != nil {
		return fmt.Errorf("httpGet hook: %w", err)
	}
	return nil
}
