package preflight_test

import (
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/walcount/walcount/app/preflight"
	"github.com/walcount/walcount/internal/redisconn"
	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// aclRules returns walcount's documented rules for a URL of scheme, with
// the rules drop left out and extra added.
func aclRules(t *testing.T, scheme string, drop []string, extra ...string) []string {
	t.Helper()
	o, err := redisconn.Parse(scheme, redisconn.TLSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var rules []string
	for _, r := range strings.Fields(redisconn.ACLRules(o)) {
		if !slices.Contains(drop, r) {
			rules = append(rules, r)
		}
	}
	return append(rules, extra...)
}

// TestRedisACL runs the Redis checks as users that lack one thing each:
// the finding names what is missing and the ACL SETUSER that adds it, and
// a user without CONFIG (a managed Redis) is no problem at all.
func TestRedisACL(t *testing.T) {
	t.Parallel()
	all := aclRules(t, "rediss://h:1/0", nil)
	users := []servers.RedisUser{
		{Name: "walcount", Password: "pw", Rules: all},
		{Name: "noconfig", Password: "pw", Rules: aclRules(t, "rediss://h:1/0", []string{"+config|get"})},
		{Name: "norename", Password: "pw", Rules: aclRules(t, "rediss://h:1/0", []string{"+rename"})},
		{Name: "noscripts", Password: "pw", Rules: aclRules(t, "rediss://h:1/0", []string{"+evalsha", "+hincrby"})},
		{Name: "nomulti", Password: "pw", Rules: aclRules(t, "rediss://h:1/0", []string{"+exec"})},
		{Name: "otherkeys", Password: "pw", Rules: aclRules(t, "rediss://h:1/0", []string{redisconn.KeyPattern}, "~other:*")},
		{Name: "noping", Password: "pw", Rules: aclRules(t, "rediss://h:1/0", []string{"+ping"})},
		// A user set up before change events: the rule of walcount 2026-12.
		{Name: "noevents", Password: "pw", Rules: aclRules(t, "rediss://h:1/0", []string{"+sadd", "+sscan", "+srem", "+xadd", "+xlen"})},
		{Name: "default", Rules: []string{"off"}},
	}
	r := testenv.RedisTLS(t, users...)
	f := newFixture(t, goodSchema)
	f.setUp(t)
	check := func(t *testing.T, user string) []preflight.Finding {
		cfg := f.cfg
		u, err := url.Parse(r.URLFor(servers.RedisUser{Name: user, Password: "pw"}))
		if err != nil {
			t.Fatal(err)
		}
		u.RawQuery = url.Values{redisconn.ParamCAFile: {r.TLS().CAFile}}.Encode()
		cfg.RedisURL = u.String()
		return run(t, cfg)
	}
	t.Run("least privilege", func(t *testing.T) {
		t.Parallel()
		fs := check(t, "walcount")
		want(t, fs, preflight.CheckRedisACL, preflight.OK, "Redis user walcount may run every command walcount needs")
		want(t, fs, preflight.CheckRedisWritable, preflight.OK, "accepts writes")
		want(t, fs, preflight.CheckRedisEviction, preflight.OK, "noeviction")
		if preflight.HasProblems(fs) {
			t.Error("problems with walcount's documented ACL rules")
		}
	})
	t.Run("no CONFIG", func(t *testing.T) {
		t.Parallel()
		fs := check(t, "noconfig")
		want(t, fs, preflight.CheckRedisACL, preflight.OK, "")
		for _, fd := range fs {
			if fd.Check == preflight.CheckRedisEviction {
				t.Errorf("a Redis that refuses CONFIG got an eviction finding: %s %s", fd.Severity, fd.Message)
			}
		}
		if preflight.HasProblems(fs) {
			t.Error("a Redis that refuses CONFIG is a problem")
		}
	})
	t.Run("a command of the scripts", func(t *testing.T) {
		t.Parallel()
		p := want(t, check(t, "norename"), preflight.CheckRedisACL, preflight.Problem, "Redis user norename may not run RENAME")
		if !strings.HasPrefix(p.Fix, "ACL SETUSER norename +rename (") || !strings.Contains(p.Fix, "~walcount:*") {
			t.Errorf("fix = %q", p.Fix)
		}
	})
	t.Run("EVALSHA and a script command", func(t *testing.T) {
		t.Parallel()
		p := want(t, check(t, "noscripts"), preflight.CheckRedisACL, preflight.Problem, "may not run")
		for _, s := range []string{"HINCRBY", "EVALSHA"} {
			if !strings.Contains(p.Message, s) {
				t.Errorf("finding %q does not name %s", p.Message, s)
			}
		}
		if !strings.HasPrefix(p.Fix, "ACL SETUSER noscripts +hincrby +evalsha (") {
			t.Errorf("fix = %q", p.Fix)
		}
	})
	t.Run("a transaction", func(t *testing.T) {
		t.Parallel()
		p := want(t, check(t, "nomulti"), preflight.CheckRedisACL, preflight.Problem, "may not run EXEC")
		if !strings.HasPrefix(p.Fix, "ACL SETUSER nomulti +exec (") {
			t.Errorf("fix = %q", p.Fix)
		}
	})
	t.Run("other keys", func(t *testing.T) {
		t.Parallel()
		fs := check(t, "otherkeys")
		p := want(t, fs, preflight.CheckRedisACL, preflight.Problem, "Redis user otherkeys may not access walcount's keys")
		if !strings.HasPrefix(p.Fix, "ACL SETUSER otherkeys ~walcount:* (") {
			t.Errorf("fix = %q", p.Fix)
		}
		none(t, fs, preflight.CheckRedisWritable, preflight.Problem)
	})
	t.Run("change events only", func(t *testing.T) {
		t.Parallel()
		fs := check(t, "noevents")
		p := want(t, fs, preflight.CheckRedisACL, preflight.Warning, "which change events need: walcount keeps the counters")
		if !strings.HasPrefix(p.Fix, "ACL SETUSER noevents +sadd +sscan +xlen +xadd +srem (") {
			t.Errorf("fix = %q", p.Fix)
		}
		if preflight.HasProblems(fs) {
			t.Error("a Redis user without the change events' commands is a problem: an upgrade would stop the counters")
		}
	})
	t.Run("PING", func(t *testing.T) {
		t.Parallel()
		fs := check(t, "noping")
		p := want(t, fs, preflight.CheckRedisACL, preflight.Problem, "may not run PING")
		if !strings.HasPrefix(p.Fix, "ACL SETUSER noping +ping (") {
			t.Errorf("fix = %q", p.Fix)
		}
		none(t, fs, preflight.CheckRedis, preflight.Problem)
	})
}

// TestRedisClusterACL checks a cluster as walcount's least-privilege user
// (CLUSTER SLOTS and COMMAND included) and as one without COMMAND.
func TestRedisClusterACL(t *testing.T) {
	t.Parallel()
	c := testenv.RedisCluster(t, servers.RedisClusterOptions{Masters: 3, Users: []servers.RedisUser{
		{Name: "walcount", Password: "pw", Rules: aclRules(t, "redis+cluster://h:1", nil)},
		{Name: "nocommand", Password: "pw", Rules: aclRules(t, "redis+cluster://h:1", []string{"+command"})},
	}})
	f := newFixture(t, goodSchema)
	f.setUp(t)
	cfg := f.cfg
	cfg.RedisURL = c.URLFor(servers.RedisUser{Name: "walcount", Password: "pw"})
	fs := run(t, cfg)
	want(t, fs, preflight.CheckRedis, preflight.OK, "Redis at cluster 127.0.0.1:")
	want(t, fs, preflight.CheckRedisACL, preflight.OK, "cluster|slots command")
	if preflight.HasProblems(fs) {
		t.Error("problems on a cluster with walcount's documented ACL rules")
	}
	cfg.RedisURL = c.URLFor(servers.RedisUser{Name: "nocommand", Password: "pw"})
	p := want(t, run(t, cfg), preflight.CheckRedisACL, preflight.Problem, "may not run COMMAND")
	if !strings.HasPrefix(p.Fix, "ACL SETUSER nocommand +command (") {
		t.Errorf("fix = %q", p.Fix)
	}
}

// TestRedisTLSVerification: insecure_skip_verify works but is a warning;
// a CA that did not sign the server's certificate is a problem that says
// why, never a silent plaintext connection.
func TestRedisTLSVerification(t *testing.T) {
	t.Parallel()
	r := testenv.RedisTLS(t)
	other, err := servers.MakeTLSFiles(t.TempDir(), "walcount")
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, goodSchema)
	f.setUp(t)
	t.Run("insecure_skip_verify", func(t *testing.T) {
		t.Parallel()
		cfg := f.cfg
		cfg.RedisURL = r.URL() + "?insecure_skip_verify=true"
		fs := run(t, cfg)
		w := want(t, fs, preflight.CheckRedisTLS, preflight.Warning, "insecure_skip_verify is on")
		if !strings.Contains(w.Fix, "ca_file") {
			t.Errorf("fix = %q", w.Fix)
		}
		want(t, fs, preflight.CheckRedis, preflight.OK, "answers PING")
		if preflight.HasProblems(fs) {
			t.Error("problems with insecure_skip_verify")
		}
	})
	t.Run("from the config file", func(t *testing.T) {
		t.Parallel()
		cfg := f.cfg
		cfg.RedisURL = r.URL()
		cfg.RedisTLS.InsecureSkipVerify = true
		want(t, run(t, cfg), preflight.CheckRedisTLS, preflight.Warning, "insecure_skip_verify is on")
	})
	t.Run("the right CA", func(t *testing.T) {
		t.Parallel()
		cfg := f.cfg
		cfg.RedisURL = r.URL()
		cfg.RedisTLS.CAFile = r.TLS().CAFile
		fs := run(t, cfg)
		none(t, fs, preflight.CheckRedisTLS, preflight.Warning)
		want(t, fs, preflight.CheckRedisACL, preflight.OK, "")
	})
	t.Run("a wrong CA", func(t *testing.T) {
		t.Parallel()
		cfg := f.cfg
		cfg.RedisURL = r.URL()
		cfg.RedisTLS.CAFile = other.CAFile
		p := want(t, run(t, cfg), preflight.CheckRedis, preflight.Problem, "does not answer PING")
		if !strings.Contains(p.Message, "x509: certificate signed by unknown authority") {
			t.Errorf("finding %q does not give the x509 reason", p.Message)
		}
	})
}
