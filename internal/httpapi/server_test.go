package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/walcount/walcount/internal/httpapi"
	"github.com/walcount/walcount/internal/metrics"
)

// start starts a server on a free loopback port and closes it at the end of
// the test.
func start(t *testing.T, opt httpapi.Options) *httpapi.Server {
	t.Helper()
	opt.Addr = "127.0.0.1:0"
	opt.Logger = zaptest.NewLogger(t)
	s := httpapi.New(opt)
	if err := s.Start(); err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

type response struct {
	code        int
	contentType string
	body        string
}

func do(t *testing.T, method, url string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body of %s %s: %v", method, url, err)
	}
	return response{resp.StatusCode, resp.Header.Get("Content-Type"), string(b)}
}

func TestHealthz(t *testing.T) {
	s := start(t, httpapi.Options{Ready: func(context.Context) error { return errors.New("not today") }})
	r := do(t, http.MethodGet, "http://"+s.Addr()+"/healthz")
	if r.code != http.StatusOK || strings.TrimSpace(r.body) != "ok" {
		t.Fatalf("/healthz = %d %q, want 200 ok even when not ready", r.code, r.body)
	}
}

func TestReadyz(t *testing.T) {
	var reason atomic.Value
	reason.Store("")
	s := start(t, httpapi.Options{Ready: func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			return errors.New("ready was called without a deadline")
		}
		if r := reason.Load().(string); r != "" {
			return errors.New(r)
		}
		return nil
	}})
	url := "http://" + s.Addr() + "/readyz"

	if r := do(t, http.MethodGet, url); r.code != http.StatusOK || strings.TrimSpace(r.body) != "ready" {
		t.Fatalf("/readyz = %d %q, want 200 ready", r.code, r.body)
	}
	reason.Store("replication slot lags 2 GiB")
	r := do(t, http.MethodGet, url)
	if r.code != http.StatusServiceUnavailable || !strings.Contains(r.body, "replication slot lags 2 GiB") {
		t.Fatalf("/readyz = %d %q, want 503 with the reason", r.code, r.body)
	}
}

func TestReadyzWithoutReadyFunc(t *testing.T) {
	s := start(t, httpapi.Options{})
	if r := do(t, http.MethodGet, "http://"+s.Addr()+"/readyz"); r.code != http.StatusOK {
		t.Fatalf("/readyz = %d %q, want 200", r.code, r.body)
	}
}

func TestStatus(t *testing.T) {
	s := start(t, httpapi.Options{Status: func(context.Context) any {
		return map[string]any{"slot": "walcount", "lag_bytes": 42}
	}})
	r := do(t, http.MethodGet, "http://"+s.Addr()+"/status")
	if r.code != http.StatusOK {
		t.Fatalf("/status = %d %q, want 200", r.code, r.body)
	}
	if r.contentType != "application/json" {
		t.Errorf("/status Content-Type = %q, want application/json", r.contentType)
	}
	if !strings.Contains(r.body, "\n  \"lag_bytes\": 42") {
		t.Errorf("/status body is not pretty-printed: %q", r.body)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(r.body), &got); err != nil {
		t.Fatalf("/status body is not JSON: %v", err)
	}
	if got["slot"] != "walcount" {
		t.Errorf("/status slot = %v, want walcount", got["slot"])
	}
}

func TestStatusThatCannotBeEncoded(t *testing.T) {
	s := start(t, httpapi.Options{Status: func(context.Context) any { return func() {} }})
	r := do(t, http.MethodGet, "http://"+s.Addr()+"/status")
	if r.code != http.StatusInternalServerError || !strings.Contains(r.body, `"error"`) {
		t.Fatalf("/status = %d %q, want 500 with a JSON error", r.code, r.body)
	}
}

func TestMetrics(t *testing.T) {
	m := metrics.New()
	m.Flushes.Add(7)
	s := start(t, httpapi.Options{Metrics: m})
	r := do(t, http.MethodGet, "http://"+s.Addr()+"/metrics")
	if r.code != http.StatusOK || !strings.Contains(r.body, "walcount_flushes_total 7") {
		t.Fatalf("/metrics = %d, body without walcount_flushes_total 7:\n%s", r.code, r.body)
	}
}

func TestNotImplemented(t *testing.T) {
	s := start(t, httpapi.Options{})
	base := "http://" + s.Addr()
	for _, tc := range []struct{ method, path string }{
		{http.MethodPost, "/v1/reconcile"},
		{http.MethodGet, "/status"},
		{http.MethodGet, "/metrics"},
	} {
		r := do(t, tc.method, base+tc.path)
		if r.code != http.StatusNotImplemented || r.contentType != "application/json" {
			t.Errorf("%s %s = %d %s, want 501 application/json", tc.method, tc.path, r.code, r.contentType)
			continue
		}
		var body struct{ Error string }
		if err := json.Unmarshal([]byte(r.body), &body); err != nil || body.Error == "" {
			t.Errorf("%s %s body = %q, want {\"error\": ...}", tc.method, tc.path, r.body)
		}
	}
}

func TestReconcile(t *testing.T) {
	var calls atomic.Int32
	s := start(t, httpapi.Options{Reconcile: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusAccepted)
	})})
	url := "http://" + s.Addr() + "/v1/reconcile"
	if r := do(t, http.MethodPost, url); r.code != http.StatusAccepted {
		t.Fatalf("POST /v1/reconcile = %d, want the handler's 202", r.code)
	}
	if r := do(t, http.MethodGet, url); r.code != http.StatusMethodNotAllowed {
		t.Fatalf("GET /v1/reconcile = %d, want 405", r.code)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("reconcile handler called %d times, want 1", n)
	}
}

func TestStartErrors(t *testing.T) {
	if err := httpapi.New(httpapi.Options{}).Start(); !errors.Is(err, httpapi.ErrNoAddr) {
		t.Errorf("Start without an address = %v, want ErrNoAddr", err)
	}
	s := start(t, httpapi.Options{})
	if err := s.Start(); !errors.Is(err, httpapi.ErrStarted) {
		t.Errorf("second Start = %v, want ErrStarted", err)
	}
	taken := httpapi.New(httpapi.Options{Addr: s.Addr()})
	if err := taken.Start(); err == nil {
		_ = taken.Close(context.Background())
		t.Errorf("Start on the address %s in use succeeded", s.Addr())
	}
	if got := httpapi.New(httpapi.Options{Addr: "127.0.0.1:0"}).Addr(); got != "" {
		t.Errorf("Addr before Start = %q, want empty", got)
	}
}

// TestCloseWaitsForRequestsInFlight checks graceful shutdown: Close returns
// only after a running request has finished, and that request completes.
func TestCloseWaitsForRequestsInFlight(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	s := httpapi.New(httpapi.Options{
		Addr:   "127.0.0.1:0",
		Logger: zaptest.NewLogger(t),
		Status: func(context.Context) any {
			close(entered)
			<-release
			return "done"
		},
	})
	if err := s.Start(); err != nil {
		t.Fatalf("start: %v", err)
	}
	got := make(chan response, 1)
	go func() {
		resp, err := http.Get("http://" + s.Addr() + "/status")
		if err != nil {
			got <- response{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		got <- response{code: resp.StatusCode, body: string(b)}
	}()
	<-entered

	closed := make(chan error, 1)
	go func() { closed <- s.Close(context.Background()) }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a request was in flight", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatalf("close: %v", err)
	}
	if r := <-got; r.code != http.StatusOK || strings.TrimSpace(r.body) != `"done"` {
		t.Fatalf("in-flight request got %d %q, want 200 \"done\"", r.code, r.body)
	}
	if _, err := http.Get("http://" + s.Addr() + "/healthz"); err == nil {
		t.Fatal("server still answers after Close")
	}
}

// TestCloseGivesUpAtTheDeadline checks that Close does not hang on a request
// that never finishes.
func TestCloseGivesUpAtTheDeadline(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	s := httpapi.New(httpapi.Options{
		Addr:   "127.0.0.1:0",
		Logger: zaptest.NewLogger(t),
		Status: func(context.Context) any {
			close(entered)
			<-release
			return nil
		},
	})
	if err := s.Start(); err != nil {
		t.Fatalf("start: %v", err)
	}
	go func() {
		if resp, err := http.Get("http://" + s.Addr() + "/status"); err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := s.Close(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v, want a deadline error", err)
	}
}
