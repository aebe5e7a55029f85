package api

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/mqlet/mqlet/core/execio"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ExecProvider is implemented by providers that can run a command in a pod's container.
type ExecProvider interface {
	// ExecTarget checks that the pod and container exist and the container is running, and
	// returns the id ExecStream takes. An empty container means the pod's first.
	ExecTarget(namespace, name, container string) (string, error)
	// ExecStream runs cmd in container id with its stdio on s until it ends (its exit code) or
	// ctx ends (the command is killed).
	ExecStream(ctx context.Context, id string, cmd []string, s execio.Streams) (int, error)
}

// execUpgrade is the protocol an exec connection is upgraded to: after the 101 answer, both
// sides exchange frames (execFrame) on the raw connection.
const execUpgrade = "mqlet-exec"

// Frame kinds. A frame is kind (1 byte), payload length (uint32, big endian), payload.
const (
	frameStdin    = 'i' // client -> agent: bytes for the command's stdin
	frameStdinEOF = 'I' // client -> agent: stdin ended
	frameResize   = 'r' // client -> agent: width, height (uint16 each, big endian)
	frameStdout   = 'o' // agent -> client
	frameStderr   = 'e' // agent -> client
	frameExit     = 'x' // agent -> client, last: the exit code (int32, big endian)
	frameError    = 'E' // agent -> client, last: the exec failed; payload is why
)

// maxFrame bounds a frame's payload, so a peer cannot make the other side allocate at will.
const maxFrame = 64 << 10

// frameWriter writes frames of one kind to a connection shared with other frameWriters.
type frameWriter struct {
	mu   *sync.Mutex
	w    io.Writer
	kind byte
}

func (f frameWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), maxFrame)]
		if err := writeFrame(f.mu, f.w, f.kind, chunk); err != nil {
			return n, err
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

func writeFrame(mu *sync.Mutex, w io.Writer, kind byte, payload []byte) error {
	mu.Lock()
	defer mu.Unlock()
	var hdr [5]byte
	hdr[0] = kind
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

func readFrame(r io.Reader, buf []byte) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxFrame {
		return 0, nil, fmt.Errorf("exec frame of %d bytes, more than %d", n, maxFrame)
	}
	if _, err := io.ReadFull(r, buf[:n]); err != nil {
		return 0, nil, fmt.Errorf("exec frame: %w", err)
	}
	return hdr[0], buf[:n], nil
}

// execParams are an exec request's query parameters (kubectl's names where it has them).
type execParams struct {
	container string
	command   []string
	stdin     bool
	tty       bool
	size      execio.TermSize
}

func parseExecParams(q url.Values) (execParams, error) {
	p := execParams{container: q.Get("container"), command: q["command"], stdin: q.Get("stdin") == "true", tty: q.Get("tty") == "true"}
	if len(p.command) == 0 {
		return p, errors.New("exec: no command given")
	}
	for _, f := range []struct {
		name string
		v    *uint16
	}{{"width", &p.size.Width}, {"height", &p.size.Height}} {
		if s := q.Get(f.name); s != "" {
			n, err := strconv.ParseUint(s, 10, 16)
			if err != nil {
				return p, fmt.Errorf("exec: %s %q: want a number of cells", f.name, s)
			}
			*f.v = uint16(n)
		}
	}
	return p, nil
}

// exec serves POST .../pods/{name}/exec: it checks the target, upgrades the connection to
// execUpgrade and relays frames until the command ends, then sends its exit code. A client that
// goes away ends the command.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	ep, ok := s.p.(ExecProvider)
	if !ok {
		s.writeJSON(w, http.StatusNotFound, failure(http.StatusNotFound, metav1.StatusReasonNotFound, "this agent cannot exec"))
		return
	}
	p, err := parseExecParams(r.URL.Query())
	if err != nil {
		s.writeJSON(w, http.StatusBadRequest, failure(http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error()))
		return
	}
	if r.Header.Get("Upgrade") != execUpgrade {
		s.writeJSON(w, http.StatusBadRequest, failure(http.StatusBadRequest, metav1.StatusReasonBadRequest,
			fmt.Sprintf("exec needs a connection upgrade to %s (use mqlet exec)", execUpgrade)))
		return
	}
	ns, name := r.PathValue("ns"), r.PathValue("name")
	id, err := ep.ExecTarget(ns, name, p.container)
	if err != nil {
		s.writeJSON(w, http.StatusNotFound, failure(http.StatusNotFound, metav1.StatusReasonNotFound, err.Error()))
		return
	}
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		s.writeJSON(w, http.StatusInternalServerError, failure(http.StatusInternalServerError, metav1.StatusReasonInternalError, "exec: "+err.Error()))
		return
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: "+execUpgrade+"\r\nConnection: Upgrade\r\n\r\n"); err != nil {
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	// A write blocked on a client that stopped reading, or the frame reader, end when the
	// connection closes: on the command's end (deferred) or the client's or agent's (here).
	stopClose := context.AfterFunc(ctx, func() { conn.Close() })
	defer stopClose()

	var wmu sync.Mutex
	streams := execio.Streams{
		Stdout: frameWriter{&wmu, conn, frameStdout},
		Stderr: frameWriter{&wmu, conn, frameStderr},
		TTY:    p.tty,
		Size:   p.size,
	}
	resize := make(chan execio.TermSize, 1)
	streams.Resize = resize
	var stdinW *io.PipeWriter
	if p.stdin {
		var stdinR *io.PipeReader
		stdinR, stdinW = io.Pipe()
		defer stdinR.Close()
		streams.Stdin = stdinR
	}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		s.readExecFrames(ctx, rw.Reader, stdinW, resize)
		// The client closed or broke the connection: it is gone, and so must the command be.
		// (A client that only ended stdin sends frameStdinEOF and keeps reading.)
		cancel()
	}()
	code, err := ep.ExecStream(ctx, id, p.command, streams)
	if ctx.Err() == nil {
		if err != nil {
			writeFrame(&wmu, conn, frameError, []byte(err.Error()))
		} else {
			var b [4]byte
			binary.BigEndian.PutUint32(b[:], uint32(int32(code)))
			writeFrame(&wmu, conn, frameExit, b[:])
		}
	} else if err != nil {
		s.log.Info("exec ended with its client", "pod", ns+"/"+name, "err", err)
	}
	conn.Close()
	<-readerDone
}

// readExecFrames passes the client's frames on until the connection ends.
func (s *Server) readExecFrames(ctx context.Context, r *bufio.Reader, stdin *io.PipeWriter, resize chan execio.TermSize) {
	if stdin != nil {
		defer stdin.CloseWithError(errors.New("exec client gone"))
	}
	buf := make([]byte, maxFrame)
	for {
		kind, payload, err := readFrame(r, buf)
		if err != nil {
			return
		}
		switch kind {
		case frameStdin:
			if stdin != nil {
				if _, err := stdin.Write(payload); err != nil {
					stdin = nil // the command's stdin is closed; later input has nowhere to go
				}
			}
		case frameStdinEOF:
			if stdin != nil {
				stdin.Close()
				stdin = nil
			}
		case frameResize:
			if len(payload) != 4 {
				return
			}
			sz := execio.TermSize{Width: binary.BigEndian.Uint16(payload), Height: binary.BigEndian.Uint16(payload[2:])}
			// Only the latest size matters: replace one not yet applied.
			select {
			case <-resize:
			default:
			}
			select {
			case resize <- sz:
			case <-ctx.Done():
				return
			}
		default:
			return // not our protocol: end the session rather than guess
		}
	}
}

// ExecOptions are what Client.Exec runs and where its stdio goes.
type ExecOptions struct {
	Container string // empty: the pod's first
	Command   []string
	execio.Streams
}

// Exec runs a command in a pod's container through the agent and returns its exit code once it
// has ended and its output was written out. When ctx ends first, the connection is closed and
// the agent kills the command.
func (c *Client) Exec(ctx context.Context, namespace, name string, o ExecOptions) (int, error) {
	q := url.Values{"command": o.Command}
	if o.Container != "" {
		q.Set("container", o.Container)
	}
	if o.Stdin != nil {
		q.Set("stdin", "true")
	}
	if o.TTY {
		q.Set("tty", "true")
		if o.Size.Width > 0 && o.Size.Height > 0 {
			q.Set("width", strconv.Itoa(int(o.Size.Width)))
			q.Set("height", strconv.Itoa(int(o.Size.Height)))
		}
	}
	u := "http://" + unixHost + "/api/v1/namespaces/" + url.PathEscape(namespace) + "/pods/" + url.PathEscape(name) + "/exec?" + q.Encode()
	req, err := http.NewRequest(http.MethodPost, u, nil)
	if err != nil {
		return -1, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", execUpgrade)
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.socketPath)
	if err != nil {
		return -1, &unreachableError{socketPath: c.socketPath, err: err}
	}
	defer conn.Close()
	stopClose := context.AfterFunc(ctx, func() { conn.Close() })
	defer stopClose()
	if err := req.Write(conn); err != nil {
		return -1, fmt.Errorf("exec in pod %s/%s: %w", namespace, name, err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		if ctx.Err() != nil {
			return -1, ctx.Err()
		}
		return -1, fmt.Errorf("exec in pod %s/%s: %w", namespace, name, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		return -1, statusFromResponse(resp)
	}

	var wmu sync.Mutex
	done := make(chan struct{})
	defer close(done)
	if o.Stdin != nil {
		go func() {
			// Copy errors are the connection's, which the frame reader below reports.
			if _, err := io.Copy(frameWriter{&wmu, conn, frameStdin}, o.Stdin); err == nil {
				writeFrame(&wmu, conn, frameStdinEOF, nil)
			}
		}()
	}
	if o.TTY && o.Resize != nil {
		go func() {
			for {
				select {
				case <-done:
					return
				case sz, ok := <-o.Resize:
					if !ok {
						return
					}
					var b [4]byte
					binary.BigEndian.PutUint16(b[:], sz.Width)
					binary.BigEndian.PutUint16(b[2:], sz.Height)
					if writeFrame(&wmu, conn, frameResize, b[:]) != nil {
						return
					}
				}
			}
		}()
	}
	stdout, stderr := o.Stdout, o.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	buf := make([]byte, maxFrame)
	for {
		kind, payload, err := readFrame(br, buf)
		if err != nil {
			if ctx.Err() != nil {
				return -1, ctx.Err()
			}
			return -1, fmt.Errorf("exec in pod %s/%s: connection to the agent ended before the command did: %w", namespace, name, err)
		}
		switch kind {
		case frameStdout:
			if _, err := stdout.Write(payload); err != nil {
				return -1, fmt.Errorf("exec in pod %s/%s: write stdout: %w", namespace, name, err)
			}
		case frameStderr:
			if _, err := stderr.Write(payload); err != nil {
				return -1, fmt.Errorf("exec in pod %s/%s: write stderr: %w", namespace, name, err)
			}
		case frameExit:
			if len(payload) != 4 {
				return -1, fmt.Errorf("exec in pod %s/%s: bad exit frame of %d bytes", namespace, name, len(payload))
			}
			return int(int32(binary.BigEndian.Uint32(payload))), nil
		case frameError:
			return -1, fmt.Errorf("exec in pod %s/%s: %s", namespace, name, payload)
		default:
			return -1, fmt.Errorf("exec in pod %s/%s: unknown frame kind %q from the agent", namespace, name, kind)
		}
	}
}

// statusFromResponse turns a refused exec's answer into a StatusError with the agent's message.
func statusFromResponse(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var st metav1.Status
	if json.Unmarshal(body, &st) != nil || st.Kind != "Status" {
		st = metav1.Status{Message: fmt.Sprintf("exec: mqlet agent answered %s: %s", resp.Status, strings.TrimSpace(string(body)))}
	}
	if st.Code == 0 {
		st.Code = int32(resp.StatusCode)
	}
	return &StatusError{Status: st}
}
