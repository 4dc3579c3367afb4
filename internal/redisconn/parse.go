package redisconn

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/internal/redact"
)

// Topology is the kind of Redis deployment a URL names.
type Topology string

// The topologies, named as walcount's logs and check findings name them.
const (
	Single   Topology = "single node"
	Cluster  Topology = "cluster"
	Sentinel Topology = "sentinel"
)

// Default ports of the host lists: a data node's and a sentinel's.
const (
	DefaultPort         = "6379"
	DefaultSentinelPort = "26379"
)

// Schemes lists every URL scheme Parse accepts, for messages.
const Schemes = "redis://, rediss:// or unix:// (a single node), redis+cluster:// or rediss+cluster:// (a cluster), " +
	"redis+sentinel:// or rediss+sentinel:// (a primary found through sentinels)"

// Query parameters that walcount reads itself; every other parameter is
// one of go-redis's options.
const (
	ParamCAFile             = "ca_file"
	ParamCertFile           = "cert_file"
	ParamKeyFile            = "key_file"
	ParamServerName         = "server_name"
	ParamInsecureSkipVerify = "insecure_skip_verify"
	// paramSkipVerify is go-redis's own name of insecure_skip_verify,
	// accepted so that URLs written for go-redis keep working.
	paramSkipVerify       = "skip_verify"
	ParamSentinelUsername = "sentinel_username"
	ParamSentinelPassword = "sentinel_password"
)

// reservedParams are go-redis options that a cluster or sentinel URL says
// in its own syntax: the host list, the path and the user info.
var reservedParams = []string{"addr", "master_name", "username", "password", "db"}

// TLSOptions are the TLS settings of a rediss URL. The zero value verifies
// the server against the system's certificate authorities.
type TLSOptions struct {
	// CAFile is a PEM file of the certificate authorities that sign the
	// servers' certificates; empty means the system's.
	CAFile string
	// CertFile and KeyFile are a PEM client certificate and its key, for
	// servers that demand one (tls-auth-clients yes). Both or neither.
	CertFile, KeyFile string
	// ServerName is the name the servers' certificates must carry; empty
	// means the host each connection dials.
	ServerName string
	// InsecureSkipVerify accepts any server certificate. It makes TLS
	// worthless against an attacker on the network; walcount check warns
	// while it is on.
	InsecureSkipVerify bool
}

// IsZero reports whether no setting is given.
func (t TLSOptions) IsZero() bool { return t == TLSOptions{} }

// merge returns t with every setting that over gives replaced.
func (t TLSOptions) merge(over TLSOptions) TLSOptions {
	if over.CAFile != "" {
		t.CAFile = over.CAFile
	}
	if over.CertFile != "" {
		t.CertFile = over.CertFile
	}
	if over.KeyFile != "" {
		t.KeyFile = over.KeyFile
	}
	if over.ServerName != "" {
		t.ServerName = over.ServerName
	}
	t.InsecureSkipVerify = t.InsecureSkipVerify || over.InsecureSkipVerify
	return t
}

// config builds the client TLS configuration. It reads the files now, so
// that a missing or bad file is a configuration error and not a failed
// connection later.
func (t TLSOptions) config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ParamCAFile, unwrapPath(err))
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s %s holds no PEM certificate", ParamCAFile, t.CAFile)
		}
		cfg.RootCAs = pool
	}
	switch {
	case t.CertFile != "" && t.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%s and %s: %w", ParamCertFile, ParamKeyFile, unwrapPath(err))
		}
		cfg.Certificates = []tls.Certificate{cert}
	case t.CertFile != "" || t.KeyFile != "":
		return nil, fmt.Errorf("%s and %s go together: give both or neither", ParamCertFile, ParamKeyFile)
	}
	return cfg, nil
}

// unwrapPath drops the operation from an *os.PathError, whose path the
// caller already names.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Path, pe.Err)
	}
	return err
}

// Options are a parsed Redis URL: what New needs to build a client. The
// zero value is not usable; get one from Parse. An Options prints itself
// redacted, whatever the verb.
type Options struct {
	// Topology is the kind of deployment.
	Topology Topology
	// Addrs are the node's address (a socket path for unix://), the
	// cluster's seed nodes or the sentinels.
	Addrs []string
	// MasterName is the name the sentinels know the primary by.
	MasterName string
	// DB is the database number; always 0 on a cluster.
	DB int
	// Username is the ACL user on the data nodes; "" is the default user.
	Username string
	// SentinelUsername is the ACL user on the sentinels.
	SentinelUsername string
	// TLS is nil without TLS, else the effective TLS settings.
	TLS *TLSOptions

	password, sentinelPassword string
	tlsConfig                  *tls.Config
	single                     *redis.Options
	cluster                    *redis.ClusterOptions
	failover                   *redis.FailoverOptions
	redacted                   string
}

// String returns Redacted, so that a logged Options never shows a password.
func (o Options) String() string { return o.Redacted() }

// GoString returns Redacted, for %#v.
func (o Options) GoString() string { return "redisconn.Options(" + o.Redacted() + ")" }

// Redacted returns the URL with its passwords masked, for logs.
func (o Options) Redacted() string { return o.redacted }

// HasPassword reports whether the URL gives a password for the data nodes.
func (o Options) HasPassword() bool { return o.password != "" }

// User returns the ACL user that walcount logs in as on the data nodes:
// Username, or "default".
func (o Options) User() string {
	if o.Username == "" {
		return "default"
	}
	return o.Username
}

// Describe names the deployment for messages: "127.0.0.1:6379",
// "cluster 10.0.0.1:6379,10.0.0.2:6379" or "sentinel master mymaster
// (sentinels 10.0.0.1:26379,…)".
func (o Options) Describe() string {
	switch o.Topology {
	case Cluster:
		return "cluster " + strings.Join(o.Addrs, ",")
	case Sentinel:
		return fmt.Sprintf("sentinel master %s (sentinels %s)", o.MasterName, strings.Join(o.Addrs, ","))
	default:
		return strings.Join(o.Addrs, ",")
	}
}

// WithSentinelAuth returns o with the sentinels' credentials, unless the
// URL gives them already (the URL wins). It fails on a URL of another
// topology, where the credentials would silently go unused.
func (o Options) WithSentinelAuth(username, password string) (Options, error) {
	if username == "" && password == "" {
		return o, nil
	}
	if o.Topology != Sentinel {
		return o, fmt.Errorf("sentinel credentials are set but the URL does not use sentinels (redis+sentinel:// or rediss+sentinel://)")
	}
	if o.SentinelUsername == "" && o.sentinelPassword == "" {
		o.SentinelUsername, o.sentinelPassword = username, password
	}
	return o, nil
}

// WithTimeout returns o with every dial, read and write bounded by d and
// no retries: for checks, which report a failure rather than wait it out.
func (o Options) WithTimeout(d time.Duration) Options {
	switch o.Topology {
	case Cluster:
		c := *o.cluster
		c.DialTimeout, c.ReadTimeout, c.WriteTimeout = d, d, d
		c.MaxRetries, c.DialerRetries = -1, 1
		o.cluster = &c
	case Sentinel:
		f := *o.failover
		f.DialTimeout, f.ReadTimeout, f.WriteTimeout = d, d, d
		f.MaxRetries, f.DialerRetries = -1, 1
		o.failover = &f
	default:
		s := *o.single
		s.DialTimeout, s.ReadTimeout, s.WriteTimeout = d, d, d
		s.MaxRetries, s.DialerRetries = -1, 1
		o.single = &s
	}
	return o
}

// Parse parses a Redis URL of any form the package documents. tlsOpt are
// TLS settings from elsewhere (walcount's configuration file); those the
// URL's query gives win over them. TLS settings on a URL without TLS are
// an error, so that a connection never goes out in plaintext when TLS was
// meant.
//
// The error never repeats the URL or a password; it says what is wrong.
func Parse(raw string, tlsOpt TLSOptions) (Options, error) {
	o, err := parse(raw, tlsOpt)
	if err != nil {
		// A last guard: messages are built not to hold secrets, and any
		// text that looks like one is masked as well.
		return Options{}, errors.New(redact.URL(err.Error()))
	}
	o.redacted = redact.URL(raw)
	return o, nil
}

// syntaxHint is what a URL that does not parse usually needs.
const syntaxHint = "percent-encode the characters @ : / ? # % in the user name and password (as %40 %3A %2F %3F %23 %25)"

func parse(raw string, tlsOpt TLSOptions) (Options, error) {
	if raw == "" {
		return Options{}, errors.New("empty URL")
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return Options{}, fmt.Errorf("not a URL: it must start with %s", Schemes)
	}
	scheme = strings.ToLower(scheme)
	// What follows the authority must not hold an "@": a password with a
	// raw "/", "?" or "#" makes a URL parser read the rest of the password
	// as a path or a query, where it would show up in messages.
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	if strings.Contains(rest[end:], "@") {
		return Options{}, errors.New("the URL does not parse: " + syntaxHint)
	}
	authority, tail := rest[:end], rest[end:]
	userinfo, hosts := "", authority
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo, hosts = authority[:i], authority[i+1:]
	}
	// The host list of a cluster or sentinel URL is not one host, which
	// net/url would refuse for IPv6 addresses: it is parsed apart, and the
	// URL is parsed with a placeholder host.
	placeholder := "localhost"
	switch scheme {
	case "redis", "rediss", "unix":
		placeholder = hosts
	}
	u, err := url.Parse(scheme + "://" + userinfoPrefix(userinfo) + placeholder + tail)
	if err != nil {
		return Options{}, errors.New("the URL does not parse: " + syntaxHint)
	}
	if u.Fragment != "" || strings.Contains(tail, "#") {
		return Options{}, errors.New("the URL has a fragment (#…): " + syntaxHint)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return Options{}, errors.New("the query string does not parse: percent-encode its values")
	}
	own, err := takeOwnParams(q)
	if err != nil {
		return Options{}, err
	}
	o := Options{TLS: nil}
	if u.User != nil {
		o.Username = u.User.Username()
		o.password, _ = u.User.Password()
	}
	if own.sentinelUser != nil || own.sentinelPass != nil {
		if scheme != "redis+sentinel" && scheme != "rediss+sentinel" {
			return Options{}, fmt.Errorf("%s and %s are for redis+sentinel:// and rediss+sentinel:// URLs", ParamSentinelUsername, ParamSentinelPassword)
		}
		o.SentinelUsername = deref(own.sentinelUser)
		o.sentinelPassword = deref(own.sentinelPass)
	}
	useTLS := false
	switch scheme {
	case "redis", "rediss", "unix":
		o.Topology, useTLS = Single, scheme == "rediss"
		err = o.parseSingle(u, q)
	case "redis+cluster", "rediss+cluster":
		o.Topology, useTLS = Cluster, scheme == "rediss+cluster"
		err = o.parseCluster(hosts, u, q)
	case "redis+sentinel", "rediss+sentinel":
		o.Topology, useTLS = Sentinel, scheme == "rediss+sentinel"
		err = o.parseSentinel(hosts, u, q)
	default:
		return Options{}, fmt.Errorf("scheme %q is not %s", scheme, Schemes)
	}
	if err != nil {
		return Options{}, err
	}
	eff := tlsOpt.merge(own.tls)
	if !useTLS {
		if !eff.IsZero() {
			return Options{}, fmt.Errorf("TLS settings (%s) are given but the scheme %s:// does not use TLS: use the scheme with two s (rediss://, rediss+cluster://, rediss+sentinel://)",
				strings.Join(eff.names(), ", "), scheme)
		}
		return o, nil
	}
	if o.tlsConfig, err = eff.config(); err != nil {
		return Options{}, err
	}
	o.TLS = &eff
	return o, nil
}

// userinfoPrefix returns "userinfo@", or "" when there is none.
func userinfoPrefix(userinfo string) string {
	if userinfo == "" {
		return ""
	}
	return userinfo + "@"
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// names lists the settings t gives, by their parameter names.
func (t TLSOptions) names() []string {
	var n []string
	for _, s := range []struct {
		name string
		set  bool
	}{
		{ParamCAFile, t.CAFile != ""},
		{ParamCertFile, t.CertFile != ""},
		{ParamKeyFile, t.KeyFile != ""},
		{ParamServerName, t.ServerName != ""},
		{ParamInsecureSkipVerify, t.InsecureSkipVerify},
	} {
		if s.set {
			n = append(n, s.name)
		}
	}
	return n
}

// ownParams are the query parameters walcount reads itself.
type ownParams struct {
	tls                        TLSOptions
	sentinelUser, sentinelPass *string
}

// takeOwnParams removes walcount's own parameters from q and returns them.
func takeOwnParams(q url.Values) (ownParams, error) {
	var p ownParams
	take := func(name string) (string, bool) {
		vs, ok := q[name]
		if !ok {
			return "", false
		}
		delete(q, name)
		return vs[len(vs)-1], true
	}
	p.tls.CAFile, _ = take(ParamCAFile)
	p.tls.CertFile, _ = take(ParamCertFile)
	p.tls.KeyFile, _ = take(ParamKeyFile)
	p.tls.ServerName, _ = take(ParamServerName)
	for _, name := range []string{ParamInsecureSkipVerify, paramSkipVerify} {
		v, ok := take(name)
		if !ok {
			continue
		}
		switch strings.ToLower(v) {
		case "true", "1", "yes", "on":
			p.tls.InsecureSkipVerify = true
		case "false", "0", "no", "off", "":
		default:
			return p, fmt.Errorf("%s=%q is not true or false", name, v)
		}
	}
	if v, ok := take(ParamSentinelUsername); ok {
		p.sentinelUser = &v
	}
	if v, ok := take(ParamSentinelPassword); ok {
		p.sentinelPass = &v
	}
	return p, nil
}

// parseSingle fills o from a redis://, rediss:// or unix:// URL through
// go-redis's own parser, which also reads its tuning options from q.
func (o *Options) parseSingle(u *url.URL, q url.Values) error {
	if u.Scheme != "unix" {
		// go-redis quotes a bad path back; say what is wrong instead.
		if p := strings.Trim(u.Path, "/"); p != "" {
			if n, err := strconv.Atoi(p); err != nil || n < 0 {
				return errors.New("the path must be /<database number>, such as /0")
			}
		}
	}
	c := *u
	c.RawQuery = q.Encode()
	opt, err := redis.ParseURL(c.String())
	if err != nil {
		return goRedisError(err)
	}
	o.Addrs = []string{opt.Addr}
	o.DB = opt.DB
	o.single = opt
	return nil
}

// parseCluster fills o from a redis+cluster:// or rediss+cluster:// URL.
func (o *Options) parseCluster(hosts string, u *url.URL, q url.Values) error {
	if p := strings.Trim(u.Path, "/"); p != "" && p != "0" {
		return errors.New("a cluster has only database 0: leave the path empty or write /0")
	}
	if err := refuseReserved(q, "redis+cluster"); err != nil {
		return err
	}
	addrs, err := hostList(hosts, DefaultPort, "seed node")
	if err != nil {
		return err
	}
	tuning, err := redis.ParseClusterURL("redis://localhost?" + q.Encode())
	if err != nil {
		return goRedisError(err)
	}
	tuning.Addrs = addrs
	tuning.Username, tuning.Password = o.Username, o.password
	tuning.TLSConfig = nil
	o.Addrs = addrs
	o.cluster = tuning
	return nil
}

// parseSentinel fills o from a redis+sentinel:// or rediss+sentinel:// URL.
func (o *Options) parseSentinel(hosts string, u *url.URL, q url.Values) error {
	parts := strings.FieldsFunc(u.Path, func(r rune) bool { return r == '/' })
	switch len(parts) {
	case 1:
	case 2:
		db, err := strconv.Atoi(parts[1])
		if err != nil || db < 0 {
			return errors.New("the path must be /<master name>[/<database number>], such as /mymaster/0")
		}
		o.DB = db
	default:
		return errors.New("the path must name the master as the sentinels know it: /<master name>[/<database number>], such as /mymaster/0")
	}
	o.MasterName = parts[0]
	if err := refuseReserved(q, "redis+sentinel"); err != nil {
		return err
	}
	addrs, err := hostList(hosts, DefaultSentinelPort, "sentinel")
	if err != nil {
		return err
	}
	tuning, err := redis.ParseFailoverURL("redis://localhost?" + q.Encode())
	if err != nil {
		return goRedisError(err)
	}
	tuning.SentinelAddrs = addrs
	tuning.MasterName = o.MasterName
	tuning.DB = o.DB
	tuning.Username, tuning.Password = o.Username, o.password
	tuning.TLSConfig = nil
	o.Addrs = addrs
	o.failover = tuning
	return nil
}

// refuseReserved fails when q sets a go-redis option that the URL's own
// syntax gives.
func refuseReserved(q url.Values, scheme string) error {
	for _, name := range reservedParams {
		if _, ok := q[name]; ok {
			return fmt.Errorf("query parameter %q is not accepted in a %s URL: the hosts, the user info and the path say it", name, scheme)
		}
	}
	return nil
}

// hostList parses "h1:p1,h2:p2,…" (IPv6 addresses in brackets); a host
// without a port gets defPort.
func hostList(s, defPort, what string) ([]string, error) {
	if s == "" {
		return nil, fmt.Errorf("no %s address: list them as host:port,host:port", what)
	}
	var addrs []string
	for _, h := range strings.Split(s, ",") {
		host, port := h, defPort
		switch {
		case h == "":
			return nil, fmt.Errorf("an empty %s address in the list (two commas, or one at an end)", what)
		case strings.HasPrefix(h, "["):
			end := strings.Index(h, "]")
			if end < 0 {
				return nil, fmt.Errorf("%s address %q lacks its closing bracket", what, h)
			}
			host = h[1:end]
			switch after := h[end+1:]; {
			case after == "":
			case strings.HasPrefix(after, ":"):
				port = after[1:]
			default:
				return nil, fmt.Errorf("%s address %q is not [ipv6]:port", what, h)
			}
		case strings.Count(h, ":") == 1:
			host, port, _ = strings.Cut(h, ":")
		case strings.Contains(h, ":"):
			return nil, fmt.Errorf("%s address %q: write an IPv6 address in brackets, [::1]:6379", what, h)
		}
		if host == "" {
			return nil, fmt.Errorf("%s address %q has no host", what, h)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%s address %q has no valid port number", what, h)
		}
		addr := net.JoinHostPort(host, port)
		if slices.Contains(addrs, addr) {
			return nil, fmt.Errorf("%s address %s is listed twice", what, addr)
		}
		addrs = append(addrs, addr)
	}
	return addrs, nil
}

// goRedisError rewords an error of go-redis's URL parsers, which are
// about the query's options: it drops go-redis's "redis: " prefix.
func goRedisError(err error) error {
	msg := strings.TrimPrefix(err.Error(), "redis: ")
	if strings.HasPrefix(msg, "unexpected option") {
		msg += " (walcount reads " + strings.Join([]string{ParamCAFile, ParamCertFile, ParamKeyFile, ParamServerName,
			ParamInsecureSkipVerify, ParamSentinelUsername, ParamSentinelPassword}, ", ") + " and go-redis's options such as dial_timeout, read_timeout, pool_size)"
	}
	return errors.New(msg)
}
