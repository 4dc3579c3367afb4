package redisconn

import (
	"slices"
	"strings"
)

// KeyPattern is the ACL key pattern of walcount's keys: every key it
// reads or writes starts with "walcount:".
const KeyPattern = "~walcount:*"

// ScriptCommands are the commands walcount's Lua scripts run (package
// buffer's apply, hand-over, done, advance and length scripts, and the
// probe of walcount check). Redis checks a script's commands against the
// ACL of the user that runs the script, so each needs a permission of its
// own.
var ScriptCommands = []string{"hget", "hmget", "hset", "hdel", "hincrby", "hgetall", "hlen", "hexists", "exists", "del", "unlink", "rename",
	"xadd", "xlen", "srem"}

// ClientCommands are the commands walcount sends itself: PING (/readyz,
// walcount check), EVALSHA and EVAL (every script: go-redis tries
// EVALSHA and sends EVAL when the server does not know the script yet),
// HMGET (reading the meta hash), MULTI, EXEC, DEL and HSET (a reset of
// the buffer, UNLINK frees a big one off Redis's main thread), HSET (a
// note in the meta hash), HSCAN (a flush reads its deltas in pages) and
// HSET and DEL (walcount check's write probe), and for change events
// SADD (the keys due before a flush commits), SSCAN (a session start
// reads them back) and XLEN (the streams' lengths for /status); the
// publication scripts run XADD, XLEN and SREM (ScriptCommands).
var ClientCommands = []string{"ping", "evalsha", "eval", "hmget", "multi", "exec", "del", "unlink", "hset", "hscan", "sadd", "sscan", "xlen"}

// OptionalCommands are refused without harm: CONFIG GET reads the
// eviction policy, and walcount says nothing about it when it may not.
var OptionalCommands = []string{"config|get"}

// ACLCommands returns every command walcount runs on the data nodes of o,
// in ACL syntax and without duplicates: ClientCommands, ScriptCommands,
// on a cluster CLUSTER SLOTS and COMMAND (go-redis reads the slot map with
// the one and routes commands by what the other says of them; without it,
// it asks again before every command), and SELECT for a database other
// than 0 (go-redis selects it on every new connection). OptionalCommands
// are left out.
func ACLCommands(o Options) []string {
	var cmds []string
	add := func(list ...string) {
		for _, c := range list {
			if !slices.Contains(cmds, c) {
				cmds = append(cmds, c)
			}
		}
	}
	add(ClientCommands...)
	add(ScriptCommands...)
	if o.Topology == Cluster {
		add("cluster|slots", "command")
	}
	if o.DB != 0 {
		add("select")
	}
	return cmds
}

// ACLRules returns the least-privilege rules of walcount's user on the
// data nodes of o, as ACL SETUSER takes them after the user name and its
// password: only walcount's keys, no Pub/Sub channel, only the commands
// of ACLCommands and the optional CONFIG GET.
func ACLRules(o Options) string {
	rules := []string{"on", "resetkeys", KeyPattern, "resetchannels", "-@all"}
	for _, c := range ACLCommands(o) {
		rules = append(rules, "+"+c)
	}
	for _, c := range OptionalCommands {
		rules = append(rules, "+"+c)
	}
	return strings.Join(rules, " ")
}
