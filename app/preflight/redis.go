package preflight

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/events"
	"github.com/walcount/walcount/internal/redisconn"
)

// Names of the Redis checks beyond those of preflight.go.
const (
	// CheckRedisACL is the check that walcount's Redis user may run every
	// command walcount runs, on walcount's keys.
	CheckRedisACL = "redis_acl"
	// CheckRedisTLS is the check of the Redis TLS settings.
	CheckRedisTLS = "redis_tls"
)

// redisTimeout bounds each Redis check: an address that drops packets must
// not hang `walcount check`.
const redisTimeout = 3 * time.Second

// redisURLFix is the fix of a Redis URL that does not parse.
const redisURLFix = "set --redis-url (or WALCOUNT_REDIS_URL, or redis_url in the config file) to redis://[user:password@]host:port/db, " +
	"rediss://…, unix://…, redis+cluster://[user:password@]host:port,host:port,… or " +
	"redis+sentinel://[user:password@]host:port,host:port,…/<master name>[/db] (see docs/configuration.md)"

// aclProbeScript runs every command walcount's scripts run, on two probe
// keys of walcount's hash tag, with redis.pcall so that a refused command
// does not end the script, and returns the refusals as "command\terror".
// Redis checks the commands of a script against the ACL of the user that
// runs it, so this is what the buffer's scripts meet.
var aclProbeScript = redis.NewScript(`
local refused = {}
local function try(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    local e = r.err
    if string.find(e, 'NOPERM', 1, true) or string.find(e, 'permission', 1, true) or string.find(e, "can't run", 1, true) or string.find(e, "can't access", 1, true) then
      refused[#refused + 1] = string.lower((select(1, ...))) .. '\t' .. e
    end
  end
end
try('HSET', KEYS[1], 'f', '1')
try('HINCRBY', KEYS[1], 'n', '1')
try('HGET', KEYS[1], 'f')
try('HMGET', KEYS[1], 'f', 'n')
try('HGETALL', KEYS[1])
try('HLEN', KEYS[1])
try('HEXISTS', KEYS[1], 'f')
try('EXISTS', KEYS[1])
try('RENAME', KEYS[1], KEYS[2])
try('HDEL', KEYS[2], 'f')
try('UNLINK', KEYS[1])
try('DEL', KEYS[1], KEYS[2])
try('XADD', KEYS[1], 'MAXLEN', '~', '100', '*', 'f', '1')
try('XLEN', KEYS[1])
try('SREM', KEYS[2], 'f')
try('DEL', KEYS[1], KEYS[2])
return refused
`)

// checkRedis checks that Redis answers, that walcount's user may run
// every command walcount needs on its keys, that Redis accepts writes (a
// replica or a full noeviction instance does not) and does not evict
// walcount's keys. walcount's keys carry no TTL, so only the allkeys-*
// policies can evict them; an evicted buffer is survivable (design
// rule 7) but costs a replay from W each time.
func (r *run) checkRedis() {
	opts, err := r.cfg.RedisOptions()
	if err != nil {
		// The error never quotes the URL or a password.
		r.problem(CheckRedis, "the Redis URL cannot be parsed: "+err.Error(), redisURLFix)
		return
	}
	if opts.TLS != nil && opts.TLS.InsecureSkipVerify {
		r.warn(CheckRedisTLS, fmt.Sprintf("Redis TLS does not verify the server's certificate (insecure_skip_verify is on): "+
			"anyone on the network path to %s can pose as Redis and read or change walcount's buffer", opts.Describe()),
			"set ca_file (redis_tls.ca_file, or ?ca_file= in the URL) to the CA that signed the Redis certificates and remove insecure_skip_verify")
	}
	// go-redis's own lines about a failed dial repeat what the findings
	// say; they go to the check's logger, not to stderr.
	client := redisconn.New(opts.WithTimeout(redisTimeout), r.log)
	defer client.Close()

	ctx, cancel := context.WithTimeout(r.ctx, 4*redisTimeout)
	defer cancel()
	addr := opts.Describe()
	p := &aclProbe{user: opts.User()}
	if err := client.Ping(ctx).Err(); err != nil {
		if p.note("ping", err) {
			r.redisACLProblem(p, opts)
			return
		}
		if strings.Contains(err.Error(), "DB index is out of range") {
			// Redis answers, but SELECT of the URL's database failed.
			r.problem(CheckRedis, fmt.Sprintf("Redis at %s has no database %d (%v): a server has the number of databases its databases setting says, 16 by default, numbered from 0",
				addr, opts.DB, err),
				fmt.Sprintf("use a database number below that in the Redis URL (/0 to /15 by default; it came from %s), or raise databases in the server's redis.conf", r.cfg.OriginOf("redis_url")))
			return
		}
		r.problem(CheckRedis, fmt.Sprintf("Redis at %s does not answer PING (URL from %s): %v", addr, r.cfg.OriginOf("redis_url"), err),
			"start Redis, or set --redis-url (or WALCOUNT_REDIS_URL) to a reachable Redis")
		switch {
		case Unreachable(err):
			r.findings[len(r.findings)-1].Cause = CauseUnreachable
		case refusedLogin(err):
			r.findings[len(r.findings)-1].Cause = CauseAccess
		}
		return
	}
	r.ok(CheckRedis, fmt.Sprintf("Redis at %s answers PING", addr))

	keys := buffer.KeysFor(r.cfg.Slot)
	// The probe keys share the hash tag of walcount's other keys (design
	// rule 6), so on a cluster they land on the node that holds them.
	key := "walcount:{" + r.cfg.Slot + "}:check"
	key2 := key + ":renamed"
	if err := client.HSet(ctx, key, "probe", time.Now().UnixNano()).Err(); err != nil {
		if !p.note("hset", err) {
			r.problem(CheckRedisWritable, fmt.Sprintf("Redis at %s does not accept writes: %v", addr, err),
				"point --redis-url at a writable primary with free memory")
			return
		}
	} else if err := client.Del(ctx, key).Err(); err != nil {
		if !p.note("del", err) {
			r.problem(CheckRedisWritable, fmt.Sprintf("Redis at %s accepted a write but not its deletion: %v", addr, err), "")
			return
		}
	} else {
		r.ok(CheckRedisWritable, fmt.Sprintf("Redis at %s accepts writes", addr))
	}
	if !r.probeRedisACL(ctx, client, opts, p, keys, key, key2) {
		return
	}
	r.checkSharedBuffer(ctx, client)

	// Managed Redis services often disable CONFIG; then nothing is said.
	ev, err := buffer.ReadEviction(ctx, client)
	if err != nil {
		r.log.Debug("cannot read Redis maxmemory settings", zap.Error(err))
		return
	}
	switch {
	case ev.Risky() && ev.Limited():
		// Every eviction of a walcount key costs a replay from W, and a
		// Redis that keeps evicting keeps walcount from moving W at all.
		r.problem(CheckRedisEviction, fmt.Sprintf("Redis at %s: %s", addr, ev), buffer.EvictionFix)
	case ev.Risky():
		r.warn(CheckRedisEviction, fmt.Sprintf("Redis at %s: %s", addr, ev), buffer.EvictionFix)
	default:
		r.ok(CheckRedisEviction, fmt.Sprintf("Redis at %s: %s", addr, ev))
	}
}

// probeRedisACL runs each command walcount needs once, on probe keys of
// walcount's hash tag, and records a finding: ok, or a Problem naming
// every refused command with the ACL rule that allows it. It reports
// whether the checks that follow can run.
func (r *run) probeRedisACL(ctx context.Context, client redis.UniversalClient, opts redisconn.Options,
	p *aclProbe, keys buffer.Keys, key, key2 string) bool {
	// The meta read and the transaction of a buffer reset.
	if err := client.HMGet(ctx, keys.Meta, "lsn").Err(); err != nil && !p.note("hmget", err) {
		return r.redisCheckFailed("HMGET", err)
	}
	// A flush reads its deltas in pages.
	if err := client.HScan(ctx, keys.Flushing, 0, "", 1).Err(); err != nil && !p.note("hscan", err) {
		return r.redisCheckFailed("HSCAN", err)
	}
	// Change events: the keys due before a commit, read back at a
	// session start, and the streams' lengths.
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"sadd", func() error { return client.SAdd(ctx, key2, "probe").Err() }},
		{"sscan", func() error { return client.SScan(ctx, key2, 0, "", 1).Err() }},
		{"xlen", func() error { return client.XLen(ctx, key).Err() }},
	} {
		if err := c.run(); err != nil && !isWrongType(err) && !p.note(c.name, err) {
			return r.redisCheckFailed(strings.ToUpper(c.name), err)
		}
	}
	_ = client.Del(ctx, key2).Err()
	cmds, err := client.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.HSet(ctx, key, "probe", 1)
		pipe.Unlink(ctx, key)
		pipe.HSet(ctx, key, "probe", 1)
		pipe.Del(ctx, key)
		return nil
	})
	if err != nil {
		// A refused command inside the transaction makes EXEC answer
		// EXECABORT; the command's own reply says why.
		noted := p.note("multi", err)
		for _, c := range cmds {
			if c.Err() != nil && p.note(c.Name(), c.Err()) {
				noted = true
			}
		}
		if !noted {
			return r.redisCheckFailed("MULTI/EXEC", err)
		}
	}
	// EVAL first, so that the EVALSHA that follows finds the script
	// loaded: go-redis runs every script with EVALSHA and falls back to
	// EVAL, and walcount needs both.
	res, err := aclProbeScript.Eval(ctx, client, []string{key, key2}).StringSlice()
	switch {
	case err != nil && p.note("eval", err):
	case err != nil:
		return r.redisCheckFailed("EVAL", err)
	default:
		for _, line := range res {
			cmd, msg, _ := strings.Cut(line, "\t")
			p.note(cmd, errors.New(msg))
		}
		if err := aclProbeScript.EvalSha(ctx, client, []string{key, key2}).Err(); err != nil && !p.note("evalsha", err) {
			return r.redisCheckFailed("EVALSHA", err)
		}
	}
	if opts.Topology == redisconn.Cluster {
		if err := client.ClusterSlots(ctx).Err(); err != nil && !p.note("cluster|slots", err) {
			return r.redisCheckFailed("CLUSTER SLOTS", err)
		}
		if err := client.Command(ctx).Err(); err != nil && !p.note("command", err) {
			return r.redisCheckFailed("COMMAND", err)
		}
	}
	events := p.eventsOnly()
	if len(events) > 0 && r.cfg.EventsMaxLen == 0 {
		// Change events are off: their commands are not needed.
		p.refused = slices.DeleteFunc(p.refused, func(c string) bool { return slices.Contains(events, c) })
		events = nil
	}
	switch {
	case len(events) > 0 && len(p.refused) == len(events) && !p.keysRefused:
		// Only change events' commands: walcount runs without events
		// until they are granted (events.Publisher.Probe).
		r.warn(CheckRedisACL, fmt.Sprintf("Redis user %s may not run %s, which change events need: walcount keeps the counters but publishes no change events until it may (%s)",
			p.user, strings.ToUpper(strings.Join(events, ", ")), p.first),
			fmt.Sprintf("ACL SETUSER %s +%s (walcount's whole rule: ACL SETUSER %s %s), or events_maxlen: 0",
				p.user, strings.Join(events, " +"), p.user, redisconn.ACLRules(opts)))
		return true
	case len(p.refused) > 0 || p.keysRefused:
		r.redisACLProblem(p, opts)
		return true
	}
	r.ok(CheckRedisACL, fmt.Sprintf("Redis user %s may run every command walcount needs on its keys (%s)",
		p.user, strings.Join(redisconn.ACLCommands(opts), " ")))
	return true
}

// redisCheckFailed records a probe that failed for another reason than a
// permission, and reports false: Redis is in no state for more checks.
func (r *run) redisCheckFailed(what string, err error) bool {
	r.problem(CheckRedis, fmt.Sprintf("Redis refused %s for a reason other than a permission: %v", what, err), "")
	return false
}

// redisACLProblem records the Problem of the refused commands.
func (r *run) redisACLProblem(p *aclProbe, opts redisconn.Options) {
	var rules, what []string
	if p.keysRefused {
		rules = append(rules, redisconn.KeyPattern)
		what = append(what, "may not access walcount's keys")
	}
	if len(p.refused) > 0 {
		names := make([]string, len(p.refused))
		for i, c := range p.refused {
			names[i] = strings.ToUpper(strings.ReplaceAll(c, "|", " "))
			rules = append(rules, "+"+c)
		}
		what = append(what, "may not run "+strings.Join(names, ", "))
	}
	msg := fmt.Sprintf("Redis user %s %s (%s)", p.user, strings.Join(what, " and "), p.first)
	fix := fmt.Sprintf("ACL SETUSER %s %s (walcount's whole rule: ACL SETUSER %s %s; in an ACL file or on every node of a cluster)",
		p.user, strings.Join(rules, " "), p.user, redisconn.ACLRules(opts))
	r.accessProblem(CheckRedisACL, msg, fix)
}

// eventsOnly returns the refused commands that only change events need
// (events.Commands).
func (p *aclProbe) eventsOnly() []string {
	var out []string
	for _, c := range p.refused {
		if slices.Contains(events.Commands, c) {
			out = append(out, c)
		}
	}
	return out
}

// aclProbe collects the permissions Redis refused.
type aclProbe struct {
	user        string
	refused     []string // commands, lower case, in ACL syntax
	keysRefused bool
	first       string // the first refusal's message
}

// note records err when it is a refused permission, and reports whether
// it was one. cmd names the command probed; a NOPERM reply that names
// another one (a transaction refused at EXEC, say) wins over it.
func (p *aclProbe) note(cmd string, err error) bool {
	msg := err.Error()
	if !isNoPerm(msg) {
		return false
	}
	if p.first == "" {
		p.first = msg
	}
	if strings.Contains(msg, "access") {
		// "no permissions to access one of the keys", or a script's
		// "can't access at least one of the keys".
		p.keysRefused = true
		return true
	}
	if _, rest, ok := strings.Cut(msg, "to run the '"); ok {
		if name, _, ok := strings.Cut(rest, "'"); ok && name != "" {
			cmd = strings.ToLower(name)
		}
	}
	if !slices.Contains(p.refused, cmd) {
		p.refused = append(p.refused, cmd)
	}
	return true
}

// isNoPerm recognises Redis's refusals of a permission: NOPERM replies,
// and the error a script meets when its user may not run a command.
func isNoPerm(msg string) bool {
	return strings.Contains(msg, "NOPERM") || strings.Contains(msg, "no permissions") ||
		strings.Contains(msg, "can't run this command") || strings.Contains(msg, "can't access")
}

// isWrongType reports a command run on a probe key of another type: the
// user may run it.
func isWrongType(err error) bool { return strings.HasPrefix(err.Error(), "WRONGTYPE") }
