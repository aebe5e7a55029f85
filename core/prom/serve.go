package prom

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Bounds of the TCP endpoint. Its answers are small and made from memory, so a client that takes
// longer than this is slow or hostile, and must not hold a connection (each costs a goroutine).
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 60 * time.Second
	maxHeaderBytes    = 8 << 10
	shutdownTimeout   = 5 * time.Second
)

// Endpoints is the TCP endpoint's handler: GET /metrics from metrics, GET /healthz and /readyz from
// health (the local API's handler, so both answer alike), and 404 for anything else. The pod API
// is not reachable this way: it shows pod specs, environment included, to whoever can connect.
func Endpoints(metrics, health http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics)
	mux.Handle("GET /healthz", health)
	mux.Handle("GET /readyz", health)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not found: this endpoint serves /metrics, /healthz and /readyz only", http.StatusNotFound)
	})
	return mux
}

// Listen opens the TCP endpoint's address; the error names it, since a taken port or a wrong host
// is the usual reason.
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics address %s: cannot listen: %w", addr, err)
	}
	return ln, nil
}

// Serve serves h on ln until ctx ends, then shuts down (in-flight requests get a few seconds) and
// returns nil; ln is closed either way.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("metrics listening", "address", ln.Addr().String())
	var err error
	select {
	case err = <-served:
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		if serr := srv.Shutdown(sctx); serr != nil {
			srv.Close()
		}
		cancel()
		err = <-served
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics address %s: %w", ln.Addr(), err)
	}
	return nil
}
