package redisconn

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/walcount/walcount/internal/testkit/servers"
)

// secret is the password of every URL below; no error and no redacted form
// may contain it.
const secret = "s3cr3t-Pw"

func TestParseForms(t *testing.T) {
	t.Parallel()
	tests := []struct {
		url      string
		topology Topology
		addrs    []string
		user     string
		password string
		db       int
		master   string
		sentUser string
		sentPass string
		tls      bool
	}{
		{url: "redis://localhost:6379/0", topology: Single, addrs: []string{"localhost:6379"}},
		{url: "redis://cache", topology: Single, addrs: []string{"cache:6379"}},
		{url: "redis://:" + secret + "@cache:6380/3", topology: Single, addrs: []string{"cache:6380"}, password: secret, db: 3},
		{url: "redis://walcount:" + secret + "@cache:6380/1?dial_timeout=2s", topology: Single, addrs: []string{"cache:6380"},
			user: "walcount", password: secret, db: 1},
		{url: "redis://[::1]:6379/0", topology: Single, addrs: []string{"[::1]:6379"}},
		{url: "rediss://u:" + secret + "@cache:6380/0", topology: Single, addrs: []string{"cache:6380"}, user: "u", password: secret, tls: true},
		{url: "unix:///run/redis.sock?db=2", topology: Single, addrs: []string{"/run/redis.sock"}, db: 2},
		{url: "unix://walcount:" + secret + "@/run/redis.sock", topology: Single, addrs: []string{"/run/redis.sock"},
			user: "walcount", password: secret},
		{url: "redis+cluster://10.0.0.1:7000,10.0.0.2:7001,10.0.0.3", topology: Cluster,
			addrs: []string{"10.0.0.1:7000", "10.0.0.2:7001", "10.0.0.3:6379"}},
		{url: "redis+cluster://walcount:" + secret + "@h1:7000,h2:7000/0?read_timeout=2s", topology: Cluster,
			addrs: []string{"h1:7000", "h2:7000"}, user: "walcount", password: secret},
		{url: "rediss+cluster://[::1]:7000,[::1]:7001", topology: Cluster, addrs: []string{"[::1]:7000", "[::1]:7001"}, tls: true},
		{url: "rediss+cluster://u:" + secret + "@[::1]:7000,[::1]:7001?dial_timeout=1s", topology: Cluster, addrs: []string{"[::1]:7000", "[::1]:7001"},
			user: "u", password: secret, tls: true},
		{url: "redis+sentinel://s1:26379,s2:26380,s3/mymaster", topology: Sentinel,
			addrs: []string{"s1:26379", "s2:26380", "s3:26379"}, master: "mymaster"},
		{url: "redis+sentinel://walcount:" + secret + "@s1,s2/mymaster/4?sentinel_password=" + secret + "&sentinel_username=sent",
			topology: Sentinel, addrs: []string{"s1:26379", "s2:26379"}, master: "mymaster", db: 4,
			user: "walcount", password: secret, sentUser: "sent", sentPass: secret},
		{url: "rediss+sentinel://:" + secret + "@s1:5000/my-master/0", topology: Sentinel, addrs: []string{"s1:5000"},
			master: "my-master", password: secret, tls: true},
		{url: "REDIS+CLUSTER://h1:1", topology: Cluster, addrs: []string{"h1:1"}},
		// A percent-encoded password holds the characters a raw one may not.
		{url: "redis://u:p%40ss%2Fw%3Ard@h:1/0", topology: Single, addrs: []string{"h:1"}, user: "u", password: "p@ss/w:rd"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			o, err := Parse(tt.url, TLSOptions{})
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if o.Topology != tt.topology || !slices.Equal(o.Addrs, tt.addrs) || o.Username != tt.user || o.password != tt.password ||
				o.DB != tt.db || o.MasterName != tt.master || o.SentinelUsername != tt.sentUser || o.sentinelPassword != tt.sentPass ||
				(o.TLS != nil) != tt.tls {
				t.Errorf("Parse = topology %q addrs %v user %q password %q db %d master %q sentinel %q/%q tls %v",
					o.Topology, o.Addrs, o.Username, o.password, o.DB, o.MasterName, o.SentinelUsername, o.sentinelPassword, o.TLS != nil)
			}
			if tt.tls != (o.tlsConfig != nil) {
				t.Errorf("tls config = %v, want TLS %v", o.tlsConfig, tt.tls)
			}
			for _, s := range []string{o.Redacted(), o.String(), fmt.Sprintf("%v %+v %#v", o, o, o)} {
				if strings.Contains(s, secret) {
					t.Errorf("printed form shows the password: %s", s)
				}
			}
			if tt.password == secret && !strings.Contains(o.Redacted(), "xxxxx") {
				t.Errorf("Redacted() = %q, want the password masked", o.Redacted())
			}
		})
	}
}

// TestParseGoRedisOptions: the query's go-redis options reach the client
// options of every topology.
func TestParseGoRedisOptions(t *testing.T) {
	t.Parallel()
	o, err := Parse("redis://h:1/0?dial_timeout=7s&pool_size=3", TLSOptions{})
	if err != nil || o.single.DialTimeout != 7*time.Second || o.single.PoolSize != 3 {
		t.Errorf("single: %v, %+v", err, o.single)
	}
	o, err = Parse("redis+cluster://h:1,h:2?read_timeout=4s&max_redirects=5", TLSOptions{})
	if err != nil || o.cluster.ReadTimeout != 4*time.Second || o.cluster.MaxRedirects != 5 || !slices.Equal(o.cluster.Addrs, []string{"h:1", "h:2"}) {
		t.Errorf("cluster: %v, %+v", err, o.cluster)
	}
	o, err = Parse("redis+sentinel://u:pw@h:1/m/2?write_timeout=3s", TLSOptions{})
	if err != nil || o.failover.WriteTimeout != 3*time.Second || o.failover.MasterName != "m" || o.failover.DB != 2 ||
		o.failover.Username != "u" || o.failover.Password != "pw" {
		t.Errorf("sentinel: %v, %+v", err, o.failover)
	}
	short := o.WithTimeout(time.Second)
	if short.failover.DialTimeout != time.Second || short.failover.MaxRetries != -1 || o.failover.DialTimeout != 0 {
		t.Errorf("WithTimeout changed %+v (and the original: %+v)", short.failover, o.failover)
	}
}

func TestParseRejects(t *testing.T) {
	t.Parallel()
	tests := []struct{ url, want string }{
		{"", "empty URL"},
		{"localhost:6379", "not a URL"},
		{"http://u:" + secret + "@h:1", `scheme "http" is not redis://, rediss:// or unix://`},
		{"redis+clusters://h:1", `scheme "redis+clusters" is not`},
		// A raw "/", "?" or "#" in a password moves the rest of it out of
		// the user info; the error must not show that rest.
		{"redis://u:" + secret + "/x@h:1/0", "percent-encode"},
		{"redis://u:" + secret + "?x@h:1/0", "percent-encode"},
		{"redis://u:" + secret + "#x@h:1/0", "percent-encode"},
		{"redis+cluster://u:" + secret + "/x@h:1", "percent-encode"},
		{"redis://u:" + secret + "@h:1/zero", "the path must be /<database number>"},
		{"redis://u:" + secret + "@h:1/0?nope=1", "unexpected option: nope"},
		{"redis://u:" + secret + "@h:1/0?dial_timeout=soon", "invalid dial_timeout duration"},
		{"redis://u:" + secret + "@h:1/0?ca_file=/ca.pem", "the scheme redis:// does not use TLS"},
		{"redis+cluster://u:" + secret + "@h:1?insecure_skip_verify=true", "the scheme redis+cluster:// does not use TLS"},
		{"rediss://u:" + secret + "@h:1/0?insecure_skip_verify=maybe", `insecure_skip_verify="maybe" is not true or false`},
		{"redis://u:" + secret + "@h:1/0?sentinel_password=x", "sentinel_username and sentinel_password are for redis+sentinel://"},
		{"redis+cluster://u:" + secret + "@", "no seed node address"},
		{"redis+cluster://u:" + secret + "@h:1,,h:2", "an empty seed node address"},
		{"redis+cluster://u:" + secret + "@h:1,h:x", `seed node address "h:x" has no valid port number`},
		{"redis+cluster://u:" + secret + "@h:1,h:70000", `seed node address "h:70000" has no valid port number`},
		{"redis+cluster://u:" + secret + "@h:1,h:1", "seed node address h:1 is listed twice"},
		{"redis+cluster://u:" + secret + "@::1:7000", "write an IPv6 address in brackets"},
		{"redis+cluster://u:" + secret + "@[::1:7000", "lacks its closing bracket"},
		{"redis+cluster://u:" + secret + "@h:1/1", "a cluster has only database 0"},
		{"redis+cluster://u:" + secret + "@h:1?addr=h:2", `query parameter "addr" is not accepted in a redis+cluster URL`},
		{"redis+sentinel://u:" + secret + "@s:1", "the path must name the master"},
		{"redis+sentinel://u:" + secret + "@s:1/", "the path must name the master"},
		{"redis+sentinel://u:" + secret + "@s:1/m/x", "the path must be /<master name>[/<database number>]"},
		{"redis+sentinel://u:" + secret + "@s:1/m/0/extra", "the path must name the master"},
		{"redis+sentinel://u:" + secret + "@s:1/m?master_name=n", `query parameter "master_name" is not accepted`},
		{"redis+sentinel://u:" + secret + "@s:1/m?password=" + secret, `query parameter "password" is not accepted`},
		{"redis+sentinel://u:" + secret + "@:1/m", `sentinel address ":1" has no host`},
		{"redis://u:" + secret + "@h:1/0?x=%zz", "the query string does not parse"},
		{"rediss://u:" + secret + "@h:1/0?ca_file=/nonexistent/ca.pem", "ca_file: /nonexistent/ca.pem: no such file or directory"},
		{"rediss://u:" + secret + "@h:1/0?cert_file=/c.pem", "cert_file and key_file go together"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			_, err := Parse(tt.url, TLSOptions{})
			if err == nil {
				t.Fatalf("Parse succeeded, want an error containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("error shows the password: %v", err)
			}
		})
	}
}

func TestParseTLS(t *testing.T) {
	t.Parallel()
	files, err := servers.MakeTLSFiles(t.TempDir(), "walcount")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("query", func(t *testing.T) {
		o, err := Parse(fmt.Sprintf("rediss+cluster://h:1,h:2?ca_file=%s&cert_file=%s&key_file=%s&server_name=redis.internal",
			files.CAFile, files.ClientCert, files.ClientKey), TLSOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c := o.tlsConfig
		if c.RootCAs == nil || len(c.Certificates) != 1 || c.ServerName != "redis.internal" || c.InsecureSkipVerify {
			t.Errorf("tls config = %+v", c)
		}
	})
	t.Run("the query wins over the file", func(t *testing.T) {
		o, err := Parse("rediss://h:1/0?server_name=from-url", TLSOptions{CAFile: files.CAFile, ServerName: "from-file"})
		if err != nil {
			t.Fatal(err)
		}
		if o.tlsConfig.ServerName != "from-url" || o.tlsConfig.RootCAs == nil || o.TLS.CAFile != files.CAFile {
			t.Errorf("tls = %+v, config %+v", o.TLS, o.tlsConfig)
		}
	})
	t.Run("without a server name each connection verifies the host it dials", func(t *testing.T) {
		o, err := Parse("rediss+sentinel://s:1/m", TLSOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if o.tlsConfig.ServerName != "" || o.tlsConfig.InsecureSkipVerify || o.tlsConfig.RootCAs != nil {
			t.Errorf("tls config = %+v", o.tlsConfig)
		}
	})
	t.Run("insecure only when asked", func(t *testing.T) {
		for _, u := range []string{"rediss://h:1/0?insecure_skip_verify=true", "rediss://h:1/0?skip_verify=1"} {
			o, err := Parse(u, TLSOptions{})
			if err != nil || !o.tlsConfig.InsecureSkipVerify || !o.TLS.InsecureSkipVerify {
				t.Errorf("%s: %v, %+v", u, err, o.TLS)
			}
		}
		o, err := Parse("rediss://h:1/0", TLSOptions{InsecureSkipVerify: true})
		if err != nil || !o.tlsConfig.InsecureSkipVerify {
			t.Errorf("from the file: %v, %+v", err, o.TLS)
		}
	})
	t.Run("file settings on a plaintext URL", func(t *testing.T) {
		_, err := Parse("redis://h:1/0", TLSOptions{CAFile: files.CAFile})
		if err == nil || !strings.Contains(err.Error(), "ca_file") || !strings.Contains(err.Error(), "does not use TLS") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("a file that is no certificate", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "ca.pem")
		if err := os.WriteFile(bad, []byte("not pem"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Parse("rediss://h:1/0", TLSOptions{CAFile: bad})
		if err == nil || !strings.Contains(err.Error(), "holds no PEM certificate") {
			t.Errorf("err = %v", err)
		}
		_, err = Parse("rediss://h:1/0", TLSOptions{CertFile: bad, KeyFile: bad})
		if err == nil || !strings.HasPrefix(err.Error(), "cert_file and key_file: ") {
			t.Errorf("err = %v", err)
		}
	})
}

func TestWithSentinelAuth(t *testing.T) {
	t.Parallel()
	o, err := Parse("redis+sentinel://s:1/m", TLSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := o.WithSentinelAuth("sent", secret)
	if err != nil || got.SentinelUsername != "sent" || got.sentinelPassword != secret {
		t.Errorf("WithSentinelAuth = %+v, %v", got, err)
	}
	// The URL's credentials win over the file's.
	o, err = Parse("redis+sentinel://s:1/m?sentinel_password=url", TLSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := o.WithSentinelAuth("", "file"); err != nil || got.sentinelPassword != "url" {
		t.Errorf("WithSentinelAuth over the URL's = %q, %v", got.sentinelPassword, err)
	}
	single, err := Parse("redis://h:1/0", TLSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := single.WithSentinelAuth("", secret); err == nil || strings.Contains(err.Error(), secret) {
		t.Errorf("sentinel credentials on a single node: %v", err)
	}
	if got, err := single.WithSentinelAuth("", ""); err != nil || got.Topology != Single {
		t.Errorf("no credentials: %v", err)
	}
}

func TestACLRules(t *testing.T) {
	t.Parallel()
	single, _ := Parse("redis://h:1/0", TLSOptions{})
	cluster, _ := Parse("redis+cluster://h:1", TLSOptions{})
	db3, _ := Parse("redis+sentinel://h:1/m/3", TLSOptions{})
	rule := ACLRules(single)
	for _, want := range []string{"~walcount:*", "-@all", "+evalsha", "+eval", "+rename", "+config|get", "resetchannels"} {
		if !strings.Contains(rule, want) {
			t.Errorf("rule %q lacks %s", rule, want)
		}
	}
	if strings.Contains(rule, "cluster|slots") || strings.Contains(rule, "+command") || strings.Contains(rule, "+select") {
		t.Errorf("single-node rule %q has cluster or select permissions", rule)
	}
	if r := ACLRules(cluster); !strings.Contains(r, "+cluster|slots") || !strings.Contains(r, "+command") {
		t.Errorf("cluster rule lacks +cluster|slots or +command: %s", r)
	}
	if !strings.Contains(ACLRules(db3), "+select") {
		t.Errorf("rule of db 3 lacks +select: %s", ACLRules(db3))
	}
	cmds := ACLCommands(single)
	for i, c := range cmds {
		if slices.Contains(cmds[i+1:], c) {
			t.Errorf("%s listed twice in %v", c, cmds)
		}
	}
}

// TestDocumentedACLRule: docs/configuration.md gives the rule ACLRules
// makes, so that the documented line is the one walcount check tests for.
func TestDocumentedACLRule(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	o, err := Parse("redis://h:1/0", TLSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rule := strings.Replace(ACLRules(o), "on ", "on >PASSWORD ", 1)
	if want := "ACL SETUSER walcount " + rule + "\n"; !strings.Contains(string(doc), want) {
		t.Errorf("docs/configuration.md lacks the line\n%s", want)
	}
	if !strings.Contains(string(doc), "add `+cluster|slots +command`") {
		t.Error("docs/configuration.md does not say what a cluster adds")
	}
}
