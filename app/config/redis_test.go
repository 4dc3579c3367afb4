package config

import (
	"errors"
	"strings"
	"testing"

	"github.com/walcount/walcount/internal/redisconn"
	"github.com/walcount/walcount/internal/testkit/servers"
)

// TestRedisSettings: every topology's URL and the redis_tls and
// redis_sentinel keys of the file reach RedisOptions.
func TestRedisSettings(t *testing.T) {
	t.Parallel()
	files, err := servers.MakeTLSFiles(t.TempDir(), "walcount")
	if err != nil {
		t.Fatal(err)
	}
	ca := files.CAFile
	file := `
redis_url: "rediss+sentinel://walcount:pw@s1:26379,s2:26379/cache/2"
redis_tls:
  ca_file: ` + ca + `
  server_name: redis.internal
redis_sentinel:
  username: sentinel-user
  password: sentinel-pw
`
	cfg, err := Parse([]byte(file), "walcount.yaml")
	if err != nil {
		t.Fatal(err)
	}
	o, err := cfg.RedisOptions()
	if err != nil {
		t.Fatal(err)
	}
	if o.Topology != redisconn.Sentinel || o.MasterName != "cache" || o.DB != 2 || o.SentinelUsername != "sentinel-user" ||
		o.TLS == nil || o.TLS.CAFile != ca || o.TLS.ServerName != "redis.internal" {
		t.Errorf("RedisOptions = %+v (tls %+v)", o, o.TLS)
	}
	for _, u := range []string{"redis+cluster://a:7000,b:7000", "rediss+cluster://:pw@[::1]:7000", "unix:///run/redis.sock"} {
		cfg := Default()
		cfg.RedisURL = u
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
}

// TestRedisSettingErrors: a bad Redis setting is a *Error under the field
// that causes it, and never repeats a password.
func TestRedisSettingErrors(t *testing.T) {
	t.Parallel()
	const secret = "pw-S3cret"
	tests := []struct {
		name, yaml, want string
	}{
		{"bad scheme", "redis_url: \"memcached://u:" + secret + "@h:1\"\n",
			`walcount.yaml: redis_url: scheme "memcached" is not redis://, rediss:// or unix://`},
		{"raw slash in the password", "redis_url: \"redis://u:" + secret + "/x@h:1/0\"\n",
			"walcount.yaml: redis_url: the URL does not parse: percent-encode"},
		{"sentinel without a master", "redis_url: \"redis+sentinel://u:" + secret + "@h:1\"\n",
			"walcount.yaml: redis_url: the path must name the master"},
		{"TLS settings on a plaintext URL", "redis_url: \"redis://u:" + secret + "@h:1/0\"\nredis_tls:\n  server_name: x\n",
			"walcount.yaml: redis_tls: TLS settings (server_name) are given but the scheme redis:// does not use TLS"},
		{"missing CA file", "redis_url: \"rediss://u:" + secret + "@h:1/0\"\nredis_tls:\n  ca_file: /nonexistent/ca.pem\n",
			"walcount.yaml: redis_tls: ca_file: /nonexistent/ca.pem: no such file or directory"},
		{"sentinel credentials without sentinels", "redis_url: \"redis+cluster://u:" + secret + "@h:1\"\nredis_sentinel:\n  password: " + secret + "\n",
			"walcount.yaml: redis_sentinel: sentinel credentials are set but the URL does not use sentinels"},
		{"unknown key", "redis_tls:\n  cafile: x\n", `walcount.yaml:2: unknown field "cafile" in redis_tls`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml), "walcount.yaml")
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error = %v, want a *config.Error", err)
			}
			if !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("error = %q, want prefix %q", err, tt.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("error shows the password: %v", err)
			}
		})
	}
}
