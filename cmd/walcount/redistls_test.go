package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/internal/redisconn"
	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// tlsSetup is a PostgreSQL and a Redis that both accept TLS connections
// only, each with a CA of its own made for the test, and a Redis user with
// exactly walcount's documented ACL rules.
type tlsSetup struct {
	pg       *servers.Postgres
	pgFiles  servers.TLSFiles
	redis    *servers.RedisTLS
	redisURL string // as the walcount user, without TLS settings
	config   string // a config file with redis_tls.ca_file
	other    servers.TLSFiles
	conn     *pgx.Conn
	dir      string
}

func newTLSSetup(t *testing.T) *tlsSetup {
	t.Helper()
	s := &tlsSetup{dir: t.TempDir()}
	var err error
	if s.pgFiles, err = servers.MakeTLSFiles(filepath.Join(s.dir, "pg"), "walcount"); err != nil {
		t.Fatal(err)
	}
	if s.other, err = servers.MakeTLSFiles(filepath.Join(s.dir, "other"), "walcount"); err != nil {
		t.Fatal(err)
	}
	s.pg = testenv.Postgres(t, servers.PostgresOptions{TLS: &s.pgFiles})
	o, err := redisconn.Parse("rediss://h:1/0", redisconn.TLSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	user := servers.RedisUser{Name: "walcount", Password: "redis-Secret-1", Rules: strings.Fields(redisconn.ACLRules(o))}
	s.redis = testenv.RedisTLS(t, user, servers.RedisUser{Name: "default", Rules: []string{"off"}})
	s.redisURL = s.redis.URLFor(user)
	s.config = filepath.Join(s.dir, "walcount.yaml")
	yaml := fmt.Sprintf("redis_tls:\n  ca_file: %q\n", s.redis.TLS().CAFile)
	if err := os.WriteFile(s.config, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if s.conn, err = pgx.Connect(ctx, s.pg.URL()); err != nil {
		t.Fatalf("connect over TLS: %v", err)
	}
	t.Cleanup(func() { s.conn.Close(context.Background()) })
	if _, err := s.conn.Exec(ctx, goodSchema+"\nINSERT INTO posts (id) SELECT g FROM generate_series(1, 20) g;"); err != nil {
		t.Fatal(err)
	}
	return s
}

// args returns the connection flags and the config file, then extra.
func (s *tlsSetup) args(cmd string, extra ...string) []string {
	return append([]string{cmd, "--database-url", s.pg.URL(), "--redis-url", s.redisURL, "--config", s.config}, extra...)
}

// withRootCert returns the PostgreSQL URL with another sslrootcert.
func (s *tlsSetup) withRootCert(t *testing.T, ca string) string {
	t.Helper()
	u, err := url.Parse(s.pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("sslrootcert", ca)
	u.RawQuery = q.Encode()
	return u.String()
}

// offPosts counts the posts whose likes_count differs from COUNT(*).
func (s *tlsSetup) offPosts(t *testing.T) int {
	t.Helper()
	var n int
	if err := s.conn.QueryRow(context.Background(),
		"SELECT count(*) FROM posts p WHERE likes_count <> (SELECT count(*) FROM likes WHERE post_id = p.id)").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTLSEverywhereLeastPrivilege runs every command against a PostgreSQL
// that takes TLS connections only (sslmode=verify-full with the test's CA)
// and a TLS-only Redis whose default user is off, as a Redis user with
// exactly walcount's documented ACL rules: check, setup, run (the real
// binary), status, reconcile and teardown all work.
func TestTLSEverywhereLeastPrivilege(t *testing.T) {
	t.Parallel()
	s := newTLSSetup(t)
	bin := walcountBinary(t)

	code, out := execute(t, s.args("setup")...)
	if code != exitOK {
		t.Fatalf("setup: exit %d\n%s", code, out)
	}
	code, out = execute(t, s.args("check")...)
	if code != exitOK {
		t.Fatalf("check: exit %d\n%s", code, out)
	}
	for _, want := range []string{"ok      Redis at 127.0.0.1:", "ok      Redis user walcount may run every command walcount needs"} {
		if !strings.Contains(out, want) {
			t.Errorf("check does not say %q", want)
		}
	}
	if strings.Contains(out, "redis-Secret-1") {
		t.Error("check shows the Redis password")
	}

	addr := tlsFreeAddr(t)
	run := tlsStartBinary(t, bin, s.args("run", "--http-addr", addr)...)
	poll(t, "walcount run streaming", func() (bool, string) {
		return strings.Contains(run.out.String(), `"streaming"`), run.out.String()
	})
	ctx := context.Background()
	if _, err := s.conn.Exec(ctx, "INSERT INTO likes (post_id) SELECT 1 + g % 20 FROM generate_series(1, 400) g"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.conn.Exec(ctx, "DELETE FROM likes WHERE id % 7 = 0"); err != nil {
		t.Fatal(err)
	}
	poll(t, "the counters to be exact", func() (bool, string) {
		n := s.offPosts(t)
		return n == 0, fmt.Sprintf("%d posts off", n)
	})

	code, out = execute(t, s.args("status", "--http-addr", addr)...)
	if code != exitOK || !says(out, "daemon streaming") || strings.Contains(out, "redis error") {
		t.Errorf("status: exit %d\n%s", code, out)
	}

	// Reconciliation corrects a counter changed behind walcount's back,
	// once the daemon's own first pass (the backfill) is over.
	poll(t, "the backfill to finish", func() (bool, string) {
		st, err := tlsDaemonStatus(addr)
		return err == nil && st.Reconcile.Last != nil && st.Reconcile.Current == nil, fmt.Sprintf("%+v %v", st, err)
	})
	if _, err := s.conn.Exec(ctx, "UPDATE posts SET likes_count = likes_count + 4 WHERE id = 3"); err != nil {
		t.Fatal(err)
	}
	code, out = execute(t, s.args("reconcile", "--http-addr", addr)...)
	if code != exitOK || !strings.Contains(out, "1 drifted, 1 corrected") {
		t.Errorf("reconcile: exit %d\n%s", code, out)
	}
	poll(t, "the counters to be exact after reconcile", func() (bool, string) {
		n := s.offPosts(t)
		return n == 0, fmt.Sprintf("%d posts off", n)
	})

	if code := run.stop(t); code != exitOK {
		t.Fatalf("walcount run exited %d on SIGTERM\n%s", code, run.out.String())
	}
	if strings.Contains(run.out.String(), "redis-Secret-1") {
		t.Error("walcount run logs the Redis password")
	}
	if !strings.Contains(run.out.String(), `"final flush done"`) {
		t.Errorf("walcount run did not flush on SIGTERM:\n%s", run.out.String())
	}

	code, out = execute(t, s.args("teardown", "--yes")...)
	if code != exitOK {
		t.Fatalf("teardown: exit %d\n%s", code, out)
	}
	var slots int
	if err := s.conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots").Scan(&slots); err != nil || slots != 0 {
		t.Errorf("after teardown: %d slots (%v)", slots, err)
	}
	admin := s.redis.Admin()
	tlsCfg, err := s.redis.ClientTLSConfig(false)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.redis.Addr(), Username: admin.Name, Password: admin.Password, TLSConfig: tlsCfg})
	defer rdb.Close()
	if n, err := rdb.Exists(ctx, buffer.KeysFor("walcount").All()...).Result(); err != nil || n != 0 {
		t.Errorf("after teardown: %d walcount keys in Redis (%v)", n, err)
	}
	// The documented rules gave walcount every command it ran.
	log, err := rdb.Do(ctx, "ACL", "LOG").Slice()
	if err != nil || len(log) != 0 {
		t.Errorf("Redis refused commands of walcount: ACL LOG = %v (%v)", log, err)
	}
}

// TestTLSVerificationFailures: a CA that did not sign the server's
// certificate stops every command with the x509 reason, and nothing goes
// out in plaintext instead; insecure_skip_verify connects but check warns.
func TestTLSVerificationFailures(t *testing.T) {
	t.Parallel()
	s := newTLSSetup(t)
	wrongPG := s.withRootCert(t, s.other.CAFile)
	for _, cmd := range []string{"check", "setup", "run"} {
		args := append(s.args(cmd), "--database-url", wrongPG, "--http-addr", "")
		code, out := execute(t, args...)
		if code == exitOK || !strings.Contains(out, "x509: certificate signed by unknown authority") {
			t.Errorf("%s with another CA for PostgreSQL: exit %d, want a failure that gives the x509 reason\n%s", cmd, code, out)
		}
	}
	var n int
	if err := s.conn.QueryRow(context.Background(), "SELECT count(*) FROM pg_replication_slots").Scan(&n); err != nil || n != 0 {
		t.Errorf("%d slots after the failed setup (%v)", n, err)
	}
	// The server refuses plaintext: nothing can have fallen back to it.
	plain := strings.Replace(s.pg.URL(), "sslmode=verify-full", "sslmode=disable", 1)
	if conn, err := pgx.Connect(context.Background(), plain); err == nil {
		conn.Close(context.Background())
		t.Error("the PostgreSQL of the test accepts plaintext connections")
	}

	// Redis with a CA that did not sign its certificate: check says why.
	cfg := filepath.Join(s.dir, "wrong-ca.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("redis_tls:\n  ca_file: %q\n", s.other.CAFile)), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := execute(t, append(s.args("setup"), "--http-addr", "")...)
	if code != exitOK {
		t.Fatalf("setup: exit %d\n%s", code, out)
	}
	code, out = execute(t, append(s.args("check"), "--config", cfg)...)
	if code != exitFailure || !strings.Contains(out, "PROBLEM Redis at 127.0.0.1:") ||
		!strings.Contains(out, "x509: certificate signed by unknown authority") {
		t.Errorf("check with another CA for Redis: exit %d\n%s", code, out)
	}
	// Without verification it connects, and check warns.
	code, out = execute(t, "check", "--database-url", s.pg.URL(), "--redis-url", s.redisURL+"?insecure_skip_verify=true")
	if code != exitOK || !strings.Contains(out, "warning Redis TLS does not verify the server's certificate (insecure_skip_verify is on)") {
		t.Errorf("check with insecure_skip_verify: exit %d\n%s", code, out)
	}
	// TLS settings on a plaintext Redis URL are a configuration error.
	code, out = execute(t, "check", "--database-url", s.pg.URL(), "--redis-url", "redis://127.0.0.1:1/0", "--config", s.config)
	if code != exitUsage || !strings.Contains(out, "redis_tls") || !strings.Contains(out, "does not use TLS") {
		t.Errorf("TLS settings with redis://: exit %d\n%s", code, out)
	}
}

// tlsFreeAddr returns a TCP address on 127.0.0.1 that was free a moment ago.
func tlsFreeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// tlsProcess is a walcount binary running in the background.
type tlsProcess struct {
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
}

// tlsStartBinary starts bin with args; the test's end kills it if it still
// runs.
func tlsStartBinary(t *testing.T, bin string, args ...string) *tlsProcess {
	t.Helper()
	p := &tlsProcess{cmd: exec.Command(bin, args...), out: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { defer close(p.done); _ = p.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
			t.Logf("walcount %s (killed at the end of the test):\n%s", args[0], p.out.String())
		}
	})
	return p
}

// stop sends SIGTERM and returns the exit code.
func (p *tlsProcess) stop(t *testing.T) int {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("walcount did not stop within %s of SIGTERM", within)
	}
	return p.cmd.ProcessState.ExitCode()
}

// tlsReconcileState is the part of /status that says where reconciliation is.
type tlsReconcileState struct {
	Reconcile struct {
		Current, Last *json.RawMessage
	} `json:"reconcile"`
}

// tlsDaemonStatus reads the daemon's /status.
func tlsDaemonStatus(addr string) (tlsReconcileState, error) {
	var st tlsReconcileState
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/status", nil)
	if err != nil {
		return st, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(body, &st)
}
