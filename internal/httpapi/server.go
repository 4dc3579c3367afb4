package httpapi

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/walcount/walcount/internal/metrics"
)

const (
	// HandlerTimeout bounds the Status and Ready functions of one request.
	HandlerTimeout = 10 * time.Second
	// ReadHeaderTimeout bounds reading a request's headers, so that a slow
	// or idle client cannot hold a connection open forever.
	ReadHeaderTimeout = 10 * time.Second
	// IdleTimeout closes keep-alive connections idle this long.
	IdleTimeout = 2 * time.Minute
)

// Log field keys.
const (
	fieldAddr     = "addr"
	fieldTokenSet = "token_required"
)

var (
	// ErrStarted is returned by a second call to Start.
	ErrStarted = errors.New("http server already started")
	// ErrNoAddr is returned by Start when Options.Addr is empty.
	ErrNoAddr = errors.New("http server has no listen address")
)

// Options configure a Server.
type Options struct {
	// Addr is the TCP address to listen on, e.g. "127.0.0.1:9750"; port 0
	// picks a free port (see Server.Addr).
	Addr string
	// Metrics is served at /metrics; nil serves a 501 there.
	Metrics *metrics.Metrics
	// Status returns the body of /status, encoded as JSON; nil serves a 501.
	// It must not return secrets.
	Status func(ctx context.Context) any
	// Ready returns nil when walcount is ready and otherwise the reason,
	// which /readyz shows with a 503. Nil means always ready.
	Ready func(ctx context.Context) error
	// Reconcile handles POST /v1/reconcile; nil serves a 501 with a JSON
	// error.
	Reconcile http.Handler
	// Counters serves the fresh reads, GET /v1/counters/…; nil serves a
	// 501 with a JSON error.
	Counters http.Handler
	// Token, when not empty, is the bearer token every POST and every
	// fresh read must carry (Authorization: Bearer <token>); others get a
	// 401. The other GET endpoints stay open: they change nothing and
	// orchestrators probe them. The token is never logged.
	Token string
	// Logger receives the server's own errors; nil means no logging.
	Logger *zap.Logger
}

// Server is walcount's HTTP server. Start it once and Close it once; its
// methods are safe for concurrent use.
type Server struct {
	opt  Options
	log  *zap.Logger
	srv  *http.Server
	mux  *http.ServeMux
	done chan struct{} // closed when the serve goroutine returns

	mu       sync.Mutex
	ln       net.Listener
	serveErr error
}

// New returns a Server that is not listening yet.
func New(opt Options) *Server {
	log := opt.Logger
	if log == nil {
		log = zap.NewNop()
	}
	s := &Server{opt: opt, log: log, mux: http.NewServeMux(), done: make(chan struct{})}
	s.routes()
	s.srv = &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: ReadHeaderTimeout,
		IdleTimeout:       IdleTimeout,
		// No WriteTimeout: /v1/reconcile may legitimately take long, and
		// Status and Ready are bounded by HandlerTimeout instead.
		ErrorLog: zap.NewStdLog(log.Named("http")),
	}
	return s
}

// Handler returns the server's routes, for serving them elsewhere (tests,
// another listener).
func (s *Server) Handler() http.Handler { return s.mux }

// Start listens on Options.Addr and serves in a goroutine that Close stops.
// It returns once the listener is bound, so Addr is known.
func (s *Server) Start() error {
	if s.opt.Addr == "" {
		return ErrNoAddr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return ErrStarted
	}
	ln, err := net.Listen("tcp", s.opt.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.opt.Addr, err)
	}
	s.ln = ln
	s.log.Info("http server listening", zap.String(fieldAddr, ln.Addr().String()), zap.Bool(fieldTokenSet, s.opt.Token != ""))
	if s.opt.Token == "" && !Loopback(ln.Addr()) {
		s.log.Warn("the HTTP API listens beyond loopback without a token: anyone who reaches "+ln.Addr().String()+
			" can start reconciliations (POST /v1/reconcile); set WALCOUNT_HTTP_TOKEN (or http_token), or listen on 127.0.0.1",
			zap.String(fieldAddr, ln.Addr().String()))
	}
	go func() {
		defer close(s.done)
		err := s.srv.Serve(ln)
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("http server stopped", zap.Error(err))
			s.mu.Lock()
			s.serveErr = fmt.Errorf("serve http: %w", err)
			s.mu.Unlock()
		}
	}()
	return nil
}

// Addr returns the address the server listens on, with the port it bound;
// empty before Start.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Close stops accepting connections, waits for the requests in flight to
// finish or for ctx to end (then it closes their connections), and waits for
// the serve goroutine. It returns the serve goroutine's error, if it failed,
// and is a no-op before Start and after the first Close.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	started := s.ln != nil
	s.mu.Unlock()
	if !started {
		return nil
	}
	err := s.srv.Shutdown(ctx)
	if err != nil {
		// Shutdown gave up on the requests in flight; cut them off so that
		// the serve goroutine returns.
		err = errors.Join(fmt.Errorf("shut down http server: %w", err), s.srv.Close())
	}
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.serveErr, err)
}

func (s *Server) routes() {
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.HandleFunc("GET /readyz", s.readyz)
	s.mux.HandleFunc("GET /status", s.status)
	if s.opt.Metrics != nil {
		s.mux.Handle("GET /metrics", s.opt.Metrics.Handler())
	} else {
		s.mux.Handle("GET /metrics", notImplemented("metrics are not available in this process"))
	}
	if s.opt.Reconcile != nil {
		s.mux.Handle("POST /v1/reconcile", s.authorized(s.opt.Reconcile))
		// A run's progress, like /status, needs no token.
		s.mux.Handle("GET /v1/reconcile/{id}", s.opt.Reconcile)
	} else {
		s.mux.Handle("POST /v1/reconcile", s.authorized(notImplemented("reconcile is not available in this process: it runs inside `walcount run`")))
	}
	// Fresh reads show the application's data: they need the token.
	counters := s.opt.Counters
	if counters == nil {
		counters = notImplemented("fresh reads are not available in this process: they are served by `walcount run`")
	}
	s.mux.Handle("GET /v1/counters/", s.authorized(counters))
}

// authorized lets a request through to h when no token is configured or
// when it carries the token; otherwise it answers 401.
func (s *Server) authorized(h http.Handler) http.Handler {
	if s.opt.Token == "" {
		return h
	}
	want := []byte("Bearer " + s.opt.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A constant-time comparison, so that response times do not
		// reveal how much of a guess was right.
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="walcount"`)
			writeJSONError(w, http.StatusUnauthorized,
				"this walcount requires a bearer token for POST requests and fresh reads: set WALCOUNT_HTTP_TOKEN (or --http-token) to the daemon's http_token, or send Authorization: Bearer <http_token>")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Loopback reports whether addr is on a loopback interface only: a
// wildcard address (0.0.0.0, ::) listens on every interface.
func Loopback(addr net.Addr) bool {
	var ip net.IP
	switch a := addr.(type) {
	case *net.TCPAddr:
		ip = a.IP
	default:
		host, _, err := net.SplitHostPort(addr.String())
		if err != nil {
			return false
		}
		ip = net.ParseIP(host)
	}
	return ip != nil && ip.IsLoopback()
}

// healthz answers whenever the process can serve HTTP at all: it checks
// nothing else, so that an orchestrator restarts walcount only when it is
// wedged, not when PostgreSQL is down (readiness says that).
func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeText(w, http.StatusOK, "ok")
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.opt.Ready == nil {
		writeText(w, http.StatusOK, "ready")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), HandlerTimeout)
	defer cancel()
	if err := s.opt.Ready(ctx); err != nil {
		writeText(w, http.StatusServiceUnavailable, "not ready: "+err.Error())
		return
	}
	writeText(w, http.StatusOK, "ready")
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	if s.opt.Status == nil {
		writeJSONError(w, http.StatusNotImplemented, "status is not available in this process")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), HandlerTimeout)
	defer cancel()
	body, err := json.MarshalIndent(s.opt.Status(ctx), "", "  ")
	if err != nil {
		s.log.Error("encode /status", zap.Error(err))
		writeJSONError(w, http.StatusInternalServerError, "encode status: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, body)
}

func notImplemented(msg string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSONError(w, http.StatusNotImplemented, msg)
	})
}

func writeText(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = fmt.Fprintln(w, msg) // the client went away; nothing to do
}

func writeJSON(w http.ResponseWriter, code int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(append(body, '\n')) // the client went away; nothing to do
}

func writeJSONError(w http.ResponseWriter, code int, msg string) {
	body, _ := json.MarshalIndent(struct {
		Error string `json:"error"`
	}{msg}, "", "  ") // a struct of one string always encodes
	writeJSON(w, code, body)
}
