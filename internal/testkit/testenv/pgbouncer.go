package testenv

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/walcount/walcount/internal/testkit/servers"
)

// PgBouncer starts a PgBouncer of the test's own in front of the server of
// dbURL (opt's Host, Port and Users are taken from it; PoolMode and
// Aliases are opt's), closes it when the test ends, and returns the pooled
// URL of dbURL's database and user.
func PgBouncer(tb testing.TB, dbURL string, opt servers.PgBouncerOptions) string {
	tb.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatal(err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		tb.Fatalf("testenv: port of %s: %v", dbURL, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	opt.Host, opt.Port, opt.Users = u.Hostname(), port, []string{u.User.Username()}
	b, err := servers.StartPgBouncer(ctx, opt)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(func() { _ = b.Close() })
	return b.URL(u.User.Username(), strings.TrimPrefix(u.Path, "/"))
}
