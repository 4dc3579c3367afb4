package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/daemon"
	"github.com/walcount/walcount/app/setup"
	"github.com/walcount/walcount/internal/httpapi"
	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/internal/testkit/wait"
	"github.com/walcount/walcount/reconcile"
	"github.com/walcount/walcount/state"
)

func TestReconcileCommandNoDaemon(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := runReconcile(context.Background(), &out, daemonAPI{addr: "127.0.0.1:1"}, reconcile.Request{})
	for _, want := range []string{"no walcount daemon answers at 127.0.0.1:1", "walcount run", "--http-addr", "WALCOUNT_HTTP_ADDR"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v; want a message that says %q", err, want)
		}
	}
	if code := exitCode(err); code != exitFailure {
		t.Errorf("exit code %d, want %d", code, exitFailure)
	}
}

func TestReconcileCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testenv.Database(t)
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, appschema.SQL(appschema.Options{Posts: 30})); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.DatabaseURL, cfg.RedisURL = dbURL, testenv.RedisURL(t)
	// Slots are cluster-wide and the cluster is shared: a slot of its own.
	cfg.Slot = fmt.Sprintf("reconcile_cmd_%d", os.Getpid())
	cfg.FlushInterval = 100 * time.Millisecond
	if _, err := setup.Run(ctx, conn, setup.Options{Config: cfg}); err != nil {
		t.Fatal(err)
	}
	d, err := daemon.New(daemon.Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	defer func() { cancel(); <-done; d.Close() }()
	srv := httpapi.New(httpapi.Options{Addr: "127.0.0.1:0", Status: func(ctx context.Context) any { return d.Status(ctx) }, Ready: d.Ready, Reconcile: d.ReconcileHandler()})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Close(ctx)

	// Let the daemon's automatic backfill of the new counter finish
	// before drift is injected, or the backfill corrects it first.
	if !wait.Until(time.Minute, 50*time.Millisecond, func() bool {
		st := d.ReconcileStatus()
		return st.Current == nil && st.Last != nil
	}) {
		t.Fatal("backfill did not finish")
	}
	if _, err := conn.Exec(ctx, `INSERT INTO likes (post_id) SELECT 1 + g % 30 FROM generate_series(1, 300) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `UPDATE posts SET likes_count = likes_count + 4 WHERE id = 3`); err != nil {
		t.Fatal(err)
	}
	api := daemonAPI{addr: srv.Addr()}
	var out bytes.Buffer
	// Drift found by a dry run is its answer, said in the exit status.
	if err := runReconcile(ctx, &out, api, reconcile.Request{DryRun: true}); exitCode(err) != exitDrift {
		t.Fatalf("dry run: %v (exit %d, want %d)\n%s", err, exitCode(err), exitDrift, out.String())
	}
	text := out.String()
	if !strings.Contains(text, "key 3 cached") || !strings.Contains(text, "30 keys checked, 1 drifted, 1 would correct (dry run)") {
		t.Fatalf("dry run output:\n%s", text)
	}
	out.Reset()
	if err := runReconcile(ctx, &out, api, reconcile.Request{}); err != nil {
		t.Fatalf("reconcile: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "1 drifted, 1 corrected") {
		t.Fatalf("reconcile output:\n%s", out.String())
	}
	var off int
	if wait.Until(30*time.Second, 50*time.Millisecond, func() bool {
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM posts p WHERE likes_count <> (SELECT count(*) FROM likes WHERE post_id = p.id)`).Scan(&off); err != nil {
			t.Fatal(err)
		}
		return off == 0
	}) {
		return
	}
	t.Fatalf("%d posts still off after the reconciliation", off)
}

// fakeDaemon answers POST /v1/reconcile and /status as a daemon whose runs
// finish at once, and keeps the requests' bodies.
type fakeDaemon struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []map[string]any
}

func newFakeDaemon(t *testing.T) *fakeDaemon {
	f := &fakeDaemon{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/reconcile":
			var body map[string]any
			_ = json.NewDecoder(r.Body).Decode(&body)
			f.mu.Lock()
			f.reqs = append(f.reqs, body)
			f.mu.Unlock()
			w.WriteHeader(http.StatusAccepted)
			_ = json.NewEncoder(w).Encode(reconcile.RunInfo{ID: 7, Status: state.StatusPending})
		case "/status":
			_ = json.NewEncoder(w).Encode(map[string]any{"reconcile": reconcile.Status{Last: &reconcile.RunInfo{ID: 7, Status: state.StatusDone, KeysChecked: 3}}})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeDaemon) addr() string { return strings.TrimPrefix(f.srv.URL, "http://") }

// requests returns the bodies received since the last call.
func (f *fakeDaemon) requests() []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.reqs
	f.reqs = nil
	return r
}

// TestReconcileMaxKeysPerSecond: --max-keys-per-second, else the file's
// reconcile.max_keys_per_second, gives the run its limit; without either
// the request leaves it to the daemon. A negative limit is a usage or
// configuration error, and nothing is asked of the daemon.
func TestReconcileMaxKeysPerSecond(t *testing.T) {
	t.Parallel()
	f := newFakeDaemon(t)
	dir := t.TempDir()
	file := func(yaml string) string {
		path := filepath.Join(dir, fmt.Sprintf("walcount-%d.yaml", time.Now().UnixNano()))
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	limited := file("reconcile:\n  max_keys_per_second: 250\n")
	tests := []struct {
		name string
		args []string
		code int
		want any // the request's max_keys_per_second; nil: not sent
		say  string
	}{
		{name: "no limit given", want: nil},
		{name: "flag", args: []string{"--max-keys-per-second", "500"}, want: 500.0},
		{name: "flag 0 lifts the daemon's limit", args: []string{"--max-keys-per-second", "0"}, want: 0.0},
		{name: "file", args: []string{"--config", limited}, want: 250.0},
		{name: "flag over file", args: []string{"--config", limited, "--max-keys-per-second", "900"}, want: 900.0},
		{name: "negative flag", args: []string{"--max-keys-per-second", "-1"}, code: exitUsage,
			say: "--max-keys-per-second: -1 is out of range: must be 0 (no limit) or more"},
		{name: "negative in the file", args: []string{"--config", file("reconcile:\n  max_keys_per_second: -3\n")}, code: exitUsage,
			say: "reconcile.max_keys_per_second: -3 is out of range"},
	}
	for _, tc := range tests {
		args := append([]string{"reconcile", "--http-addr", f.addr()}, tc.args...)
		code, out := execute(t, args...)
		if code != tc.code || !strings.Contains(out, tc.say) {
			t.Errorf("%s: exit %d, want %d, saying %q:\n%s", tc.name, code, tc.code, tc.say, out)
		}
		reqs := f.requests()
		if tc.code != 0 {
			if len(reqs) != 0 {
				t.Errorf("%s: the daemon was asked %v", tc.name, reqs)
			}
			continue
		}
		if len(reqs) != 1 {
			t.Fatalf("%s: %d requests, want 1", tc.name, len(reqs))
		}
		if got, ok := reqs[0]["max_keys_per_second"]; got != tc.want || ok != (tc.want != nil) {
			t.Errorf("%s: request %v, want max_keys_per_second %v", tc.name, reqs[0], tc.want)
		}
	}
}
