package servers_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walcount/walcount/internal/testkit/servers"
)

// tlsURL returns the URL of p's postgres database on host with the given
// sslmode and, unless "", root certificate.
func tlsURL(p *servers.Postgres, host, sslmode, rootCert string) string {
	q := url.Values{"sslmode": {sslmode}}
	if rootCert != "" {
		q.Set("sslrootcert", rootCert)
	}
	u, _ := url.Parse(p.URL())
	u.Host = host + ":" + u.Port()
	u.RawQuery = q.Encode()
	return u.String()
}

func TestPostgresTLS(t *testing.T) {
	dir := t.TempDir()
	files, err := servers.MakeTLSFiles(filepath.Join(dir, "right"), "walcount")
	if err != nil {
		t.Fatal(err)
	}
	other, err := servers.MakeTLSFiles(filepath.Join(dir, "other"), "walcount")
	if err != nil {
		t.Fatal(err)
	}
	p := startPostgres(t, servers.PostgresOptions{TLS: &files})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	if u := p.URL(); !strings.Contains(u, "sslmode=verify-full") || !strings.Contains(u, url.QueryEscape(files.CAFile)) {
		t.Errorf("URL() = %s, want sslmode=verify-full with sslrootcert=%s", u, files.CAFile)
	}
	// Both names in the server certificate verify, with the right CA.
	for _, host := range []string{"127.0.0.1", "localhost"} {
		u := tlsURL(p, host, "verify-full", files.CAFile)
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Errorf("connect %s: %v\n%s", u, err, p.LogTail(10))
			continue
		}
		var ssl bool
		var version string
		err = conn.QueryRow(ctx, "SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl, &version)
		conn.Close(ctx)
		if err != nil || !ssl {
			t.Errorf("pg_stat_ssl over %s: ssl=%v version=%s err=%v, want ssl", host, ssl, version, err)
		}
	}
	// Replication connections use TLS too.
	rconn, err := pgconn.Connect(ctx, p.URL()+"&replication=database")
	if err != nil {
		t.Errorf("replication connect over TLS: %v", err)
	} else {
		if _, err := rconn.Exec(ctx, "IDENTIFY_SYSTEM").ReadAll(); err != nil {
			t.Errorf("IDENTIFY_SYSTEM over TLS: %v", err)
		}
		rconn.Close(ctx)
	}

	// A CA that did not sign the server certificate fails verification.
	u := tlsURL(p, "127.0.0.1", "verify-full", other.CAFile)
	if conn, err := pgx.Connect(ctx, u); err == nil {
		conn.Close(ctx)
		t.Errorf("connect with another CA succeeded")
	} else if msg := err.Error(); !strings.Contains(msg, "x509") && !strings.Contains(msg, "certificate") {
		t.Errorf("connect with another CA: %v, want an x509 certificate error", err)
	}
	// TCP without TLS is refused by pg_hba.conf.
	if conn, err := pgx.Connect(ctx, tlsURL(p, "127.0.0.1", "disable", "")); err == nil {
		conn.Close(ctx)
		t.Errorf("connect with sslmode=disable succeeded")
	} else if !strings.Contains(err.Error(), "pg_hba.conf") {
		t.Errorf("connect with sslmode=disable: %v, want a pg_hba.conf refusal", err)
	}
}

// TestPostgresTLSThenPlainOnSameDir restarts a kept Dir without TLS: the
// TLS-only pg_hba.conf of the first start must not lock plain clients out.
func TestPostgresTLSThenPlainOnSameDir(t *testing.T) {
	files, err := servers.MakeTLSFiles(t.TempDir(), "walcount")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "walcount-servers-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })

	p := startPostgres(t, servers.PostgresOptions{Dir: dir, TLS: &files})
	queryString(t, connect(t, p), "SELECT 'tls'")
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	p2 := startPostgres(t, servers.PostgresOptions{Dir: dir})
	if !strings.Contains(p2.URL(), "sslmode=disable") {
		t.Errorf("URL() without TLS = %s, want sslmode=disable", p2.URL())
	}
	conn := connect(t, p2)
	if got := queryString(t, conn, "SHOW ssl"); got != "off" {
		t.Errorf("ssl = %s, want off", got)
	}
}
