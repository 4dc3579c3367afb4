package httpapi_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/walcount/walcount/internal/httpapi"
)

const testToken = "s3cret-Token_value"

func post(t *testing.T, url, authorization string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	resp.Body.Close()
	return resp
}

func TestTokenGuardsPost(t *testing.T) {
	var calls atomic.Int32
	core, logs := observer.New(zapcore.DebugLevel)
	opt := httpapi.Options{
		Addr:   "127.0.0.1:0",
		Token:  testToken,
		Logger: zap.New(core),
		Status: func(context.Context) any { return map[string]bool{"streaming": true} },
		Reconcile: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			calls.Add(1)
			w.WriteHeader(http.StatusAccepted)
		}),
	}
	s := httpapi.New(opt)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	base := "http://" + s.Addr()
	for _, auth := range []string{"", "Bearer wrong", "Bearer " + testToken + "x", testToken, "Basic " + testToken} {
		resp := post(t, base+"/v1/reconcile", auth)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("POST with Authorization %q = %d, want 401", auth, resp.StatusCode)
		}
		if !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("401 without a WWW-Authenticate: Bearer header: %v", resp.Header)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("the handler ran %d times without the token", n)
	}
	if resp := post(t, base+"/v1/reconcile", "Bearer "+testToken); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST with the token = %d, want the handler's 202", resp.StatusCode)
	}
	// GET endpoints stay open: probes and scrapers carry no token.
	for _, path := range []string{"/healthz", "/readyz", "/status"} {
		r := do(t, http.MethodGet, base+path)
		if r.code != http.StatusOK {
			t.Errorf("GET %s = %d, want 200 without a token", path, r.code)
		}
		if strings.Contains(r.body, testToken) {
			t.Errorf("GET %s shows the token: %s", path, r.body)
		}
	}
	for _, e := range logs.All() {
		line := e.Message
		for k, v := range e.ContextMap() {
			line += " " + k + "=" + strings.TrimSpace(strings.ReplaceAll(strings.ReplaceAll(toString(v), "\n", " "), "\t", " "))
		}
		if strings.Contains(line, testToken) {
			t.Errorf("a log line shows the token: %s", line)
		}
	}
}

func toString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case error:
		return x.Error()
	default:
		return ""
	}
}

func TestWarnsWhenOpenBeyondLoopback(t *testing.T) {
	const warning = "the HTTP API listens beyond loopback without a token"
	for _, tc := range []struct {
		addr, token string
		warn        bool
	}{
		{"127.0.0.1:0", "", false},
		{"localhost:0", "", false},
		{"0.0.0.0:0", "", true},
		{":0", "", true},
		{"0.0.0.0:0", testToken, false},
	} {
		core, logs := observer.New(zapcore.InfoLevel)
		s := httpapi.New(httpapi.Options{Addr: tc.addr, Token: tc.token, Logger: zap.New(core)})
		if err := s.Start(); err != nil {
			t.Fatalf("start on %s: %v", tc.addr, err)
		}
		_ = s.Close(context.Background())
		n := logs.FilterMessageSnippet(warning).FilterLevelExact(zapcore.WarnLevel).Len()
		if got := n == 1; got != tc.warn {
			t.Errorf("listening on %s (token set %v): %d warnings, want warning %v", tc.addr, tc.token != "", n, tc.warn)
		}
		for _, e := range logs.All() {
			if strings.Contains(e.Message, testToken) {
				t.Errorf("log line shows the token: %s", e.Message)
			}
		}
	}
}

func TestLoopback(t *testing.T) {
	for _, tc := range []struct {
		ip   string
		want bool
	}{
		{"127.0.0.1", true}, {"127.0.0.2", true}, {"::1", true},
		{"0.0.0.0", false}, {"::", false}, {"10.0.0.1", false}, {"192.168.1.5", false},
	} {
		if got := httpapi.Loopback(&net.TCPAddr{IP: net.ParseIP(tc.ip), Port: 9750}); got != tc.want {
			t.Errorf("Loopback(%s) = %v, want %v", tc.ip, got, tc.want)
		}
	}
}

// TestTokenGuardsFreshReads: GET /v1/counters/… shows the application's
// data, so unlike the other GET endpoints it needs the token.
func TestTokenGuardsFreshReads(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	s := start(t, httpapi.Options{
		Token: testToken,
		Counters: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			calls.Add(1)
			w.WriteHeader(http.StatusOK)
		}),
	})
	base := "http://" + s.Addr()
	read := func(path, auth string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, path := range []string{"/v1/counters/post_likes/1", "/v1/counters/post_likes?keys=1,2"} {
		for _, auth := range []string{"", "Bearer wrong", testToken} {
			if code := read(path, auth); code != http.StatusUnauthorized {
				t.Errorf("GET %s with Authorization %q = %d, want 401", path, auth, code)
			}
		}
		if n := calls.Load(); n != 0 {
			t.Fatalf("the fresh reads' handler ran %d times without the token", n)
		}
		if code := read(path, "Bearer "+testToken); code != http.StatusOK {
			t.Errorf("GET %s with the token = %d, want the handler's 200", path, code)
		}
		calls.Store(0)
	}
}
