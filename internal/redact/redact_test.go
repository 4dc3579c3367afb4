package redact_test

import (
	"strings"
	"testing"

	"github.com/walcount/walcount/internal/redact"
)

func TestURL(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"empty", "", ""},
		{"postgres without password", "postgres://postgres@localhost:5432/postgres", "postgres://postgres@localhost:5432/postgres"},
		{"postgres with password", "postgres://app:s3cret@db.example:5432/app?sslmode=require", "postgres://app:xxxxx@db.example:5432/app?sslmode=require"},
		{"postgresql scheme", "postgresql://app:s3cret@db/app", "postgresql://app:xxxxx@db/app"},
		{"percent-encoded password", "postgres://app:p%40ss%2Fw%3Ard@db/app", "postgres://app:xxxxx@db/app"},
		{"raw @ in password", "postgres://app:p@ss@db/app", "postgres://app:xxxxx@db/app"},
		{"empty password", "postgres://app:@db/app", "postgres://app:xxxxx@db/app"},
		{"password in query", "postgres:///app?host=/var/run/postgresql&password=s3cret&sslmode=disable", "postgres:///app?host=/var/run/postgresql&password=xxxxx&sslmode=disable"},
		{"sslpassword in query", "postgres://app@db/app?sslpassword=s3cret", "postgres://app@db/app?sslpassword=xxxxx"},
		{"multi-host URL (net/url rejects it)", "postgres://app:s3cret@h1:5432,h2:5432/app?target_session_attrs=read-write", "postgres://app:xxxxx@h1:5432,h2:5432/app?target_session_attrs=read-write"},
		{"invalid escape (net/url rejects it)", "postgres://app:50%zz@db/app", "postgres://app:xxxxx@db/app"},
		{"raw # in password", "redis://:123#456@cache:6379/0", "redis://:xxxxx@cache:6379/0"},
		{"raw / in password", "postgres://app:12/s3@db/app", "postgres://app:xxxxx@db/app"},
		{"raw @ and / in password", "postgres://app:a@s3/c@db/app", "postgres://app:xxxxx@db/app"},
		{"redis with password only", "redis://:s3cret@localhost:6379/0", "redis://:xxxxx@localhost:6379/0"},
		{"redis with user and password", "rediss://default:s3cret@cache:6380/1", "rediss://default:xxxxx@cache:6380/1"},
		{"redis without password", "redis://localhost:6379/0", "redis://localhost:6379/0"},
		{"dsn", "host=db user=app password=s3cret dbname=app", "host=db user=app password=xxxxx dbname=app"},
		{"dsn password first", "password=s3cret host=db", "password=xxxxx host=db"},
		{"dsn spaces around =", "host=db password = s3cret dbname=app", "host=db password = xxxxx dbname=app"},
		{"dsn quoted", `host=db password='s3 cr\'et' dbname=app`, "host=db password=xxxxx dbname=app"},
		{"dsn unterminated quote", `host=db password='s3 cret dbname=app`, "host=db password=xxxxx"},
		{"dsn upper case key", "host=db PASSWORD=s3cret", "host=db PASSWORD=xxxxx"},
		{"dsn sslpassword", "host=db sslpassword=s3cret", "host=db sslpassword=xxxxx"},
		{"dsn without password", "host=db user=app dbname=app", "host=db user=app dbname=app"},
		{"url inside a message", "connect postgres://app:s3cret@db/app: connection refused", "connect postgres://app:xxxxx@db/app: connection refused"},
		{"not a url", "just some text", "just some text"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := redact.URL(tt.in)
			if got != tt.want {
				t.Errorf("URL(%q) = %q, want %q", tt.in, got, tt.want)
			}
			if strings.Contains(got, "s3") || strings.Contains(got, "cret") {
				t.Errorf("URL(%q) = %q still shows the secret", tt.in, got)
			}
		})
	}
}

// TestURLNeverShowsThePassword checks the property the package exists for on
// awkward passwords, whatever the exact output looks like.
func TestURLNeverShowsThePassword(t *testing.T) {
	const secret = "Zq9secretvalue"
	passwords := []string{
		secret,
		secret + "@host",
		secret + "/path",
		secret + ":colon",
		secret + "?x=1",
		secret + "#frag",
		"12#" + secret,
		"12/" + secret,
		"12?" + secret,
		"a@b/" + secret,
		"%" + secret,
	}
	for _, pw := range passwords {
		for _, raw := range []string{
			"postgres://user:" + pw + "@db:5432/app",
			"redis://:" + pw + "@cache:6379/0",
			"host=db password=" + pw + " dbname=app",
			"host=db password='" + pw + "' dbname=app",
			"postgres://db/app?password=" + pw,
		} {
			if got := redact.URL(raw); strings.Contains(got, secret) {
				t.Errorf("URL(%q) = %q shows the password", raw, got)
			}
		}
	}
}
