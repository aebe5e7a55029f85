package probe

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
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

// getRequest is an httpGet action resolved against its target, and the request as it is sent.
type getRequest struct {
	url    *url.URL
	host   string // Host header
	header http.Header
	route  route
	wire   []byte
}

// render writes the request as it goes on the wire. A probe keeps it between attempts.
func (r *getRequest) render() {
	var b bytes.Buffer
	fmt.Fprintf(&b, "GET %s HTTP/1.1\r\nHost: %s\r\n", r.url.RequestURI(), r.host)
	r.header.Write(&b)
	b.WriteString("Connection: close\r\n\r\n")
	r.wire = b.Bytes()
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
	req.render()
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

// response is what a GET got: the status, where it redirects to, and for a redirect at most
// maxBody bytes of the body (kubelet's warning quotes it).
type response struct {
	status   int
	location string
	body     []byte
}

// roundTrip sends the GET on a new connection and reads the response, until ctx's deadline (a
// probe that is stopped meanwhile ends at its timeout).
func (p *Prober) roundTrip(ctx context.Context, req *getRequest) (response, error) {
	conn, err := dial(ctx, req.route, req.url.Host)
	if err != nil {
		return response{}, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
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
	if _, err := conn.Write(req.wire); err != nil {
		return response{}, fmt.Errorf("GET %s: %w", req.url, err)
	}
	br.Reset(conn)
	head, err := readHead(br)
	if err != nil {
		return response{}, fmt.Errorf("GET %s: %w", req.url, err)
	}
	out := response{status: head.status, location: head.location}
	if head.status >= 300 && head.status < 400 {
		// The rare case that quotes the body: read it properly.
		var body io.Reader = br
		switch {
		case head.chunked:
			body = httputil.NewChunkedReader(br)
		case head.length >= 0:
			body = io.LimitReader(br, head.length)
		}
		out.body, err = io.ReadAll(io.LimitReader(body, maxBody))
		if err != nil {
			return response{}, fmt.Errorf("reading the response of %s: %w", req.url, err)
		}
		return out, nil
	}
	// The body says nothing to a probe; read (a bounded part of) it so the server sees an orderly
	// close rather than a reset. A chunked one is left: the connection is closed anyway.
	switch {
	case head.noBody || head.chunked:
	case head.length >= 0:
		br.Discard(int(min(head.length, maxBody)))
	default:
		br.Discard(maxBody) // to EOF: the server closes after the response (Connection: close)
	}
	return out, nil
}

// head is what a probe needs of a response's status line and headers.
type head struct {
	status   int
	location string
	length   int64 // Content-Length, -1 if absent
	chunked  bool
	noBody   bool // 1xx, 204, 304
}

// readHead reads a response's status line and headers from br, allocating nothing but a
// redirect's Location: net/http's parser builds a header map per response, and a probe every
// second on every pod would make that most of the agent's garbage.
func readHead(br *bufio.Reader) (head, error) {
	for {
		h := head{length: -1}
		line, err := br.ReadSlice('\n')
		if err != nil {
			return h, fmt.Errorf("reading the status line: %w", err)
		}
		line = bytes.TrimRight(line, "\r\n")
		// "HTTP/1.1 200 OK"
		if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/")) || line[8] != ' ' {
			return h, fmt.Errorf("malformed status line %q", truncate(line))
		}
		code := line[9:12]
		for _, c := range code {
			if c < '0' || c > '9' {
				return h, fmt.Errorf("malformed status code in %q", truncate(line))
			}
		}
		h.status = int(code[0]-'0')*100 + int(code[1]-'0')*10 + int(code[2]-'0')
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return h, fmt.Errorf("reading the headers: %w", err)
			}
			line = bytes.TrimRight(line, "\r\n")
			if len(line) == 0 {
				break
			}
			name, value, ok := bytes.Cut(line, []byte(":"))
			if !ok {
				continue
			}
			value = bytes.TrimSpace(value)
			switch {
			case bytes.EqualFold(name, []byte("Content-Length")):
				if n, err := strconv.ParseInt(string(value), 10, 64); err == nil && n >= 0 {
					h.length = n
				}
			case bytes.EqualFold(name, []byte("Transfer-Encoding")):
				h.chunked = bytes.Contains(bytes.ToLower(value), []byte("chunked"))
			case bytes.EqualFold(name, []byte("Location")) && h.status >= 300 && h.status < 400:
				h.location = string(value)
			}
		}
		h.noBody = h.status < 200 || h.status == http.StatusNoContent || h.status == http.StatusNotModified
		if h.status >= 200 || h.status == http.StatusSwitchingProtocols {
			return h, nil
		}
		// 1xx: an interim response; the real one follows.
	}
}

func truncate(b []byte) string {
	if len(b) > 64 {
		b = b[:64]
	}
	return string(b)
}

// get runs the GET, following redirects to the same host as kubelet's probes do (up to
// maxRedirects); a redirect elsewhere is returned as the response, not followed.
func (p *Prober) get(ctx context.Context, req *getRequest) (response, error) {
	first := req.url.Hostname()
	for i := 0; ; i++ {
		res, err := p.roundTrip(ctx, req)
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
		copied.render()
		req = &copied
	}
}

func (p *Prober) httpGet(ctx context.Context, t Target, h *v1.HTTPGetAction, timeout time.Duration) (Result, string, error) {
	req, err := p.cachedRequest(t, h)
	if err != nil {
		return Unknown, "", err
	}
	res, err := p.get(ctx, req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
			return Failure, fmt.Sprintf("GET %s: no response within %s", req.url, timeout), nil
		}
		return Failure, err.Error(), nil
	}
	switch {
	case res.status >= 200 && res.status < 300:
		return Success, "", nil // kubelet only logs a success's body
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
	if _, err := p.get(ctx, req); err != nil {
		return fmt.Errorf("httpGet hook: %w", err)
	}
	return nil
}

// cache is what a running probe keeps between its attempts (see Set.run).
type cache struct {
	req *getRequest // the httpGet request, resolved and rendered
}

// cachedRequest resolves the probe's request once per probe worker (every attempt sends the same).
func (p *Prober) cachedRequest(t Target, h *v1.HTTPGetAction) (*getRequest, error) {
	if t.cache != nil && t.cache.req != nil {
		return t.cache.req, nil
	}
	req, err := p.request(t, h, "probe")
	if err == nil && t.cache != nil {
		t.cache.req = req
	}
	return req, err
}
