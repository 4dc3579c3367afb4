package servers

import (
	"reflect"
	"testing"
)

func TestQuoteRedisArg(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", `""`},
		{"yes", "yes"},
		{"~walcount:*", "~walcount:*"},
		{">pa$$word", ">pa$$word"},
		{"/tmp/dir with space", `"/tmp/dir with space"`},
		{`a"b\c`, `"a\x22b\x5cc"`},
		{"it's", `"it's"`},
		{"line\nbreak", `"line\x0abreak"`},
	} {
		if got := quoteRedisArg(tc.in); got != tc.want {
			t.Errorf("quoteRedisArg(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestRedisUserACLArgs(t *testing.T) {
	got := RedisUser{Name: "w", Password: "p", Rules: []string{"~walcount:*", "+@hash"}}.aclArgs()
	want := []string{"w", "reset", "on", ">p", "~walcount:*", "+@hash"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("aclArgs = %q, want %q", got, want)
	}
	got = RedisUser{Name: "w"}.aclArgs()
	want = []string{"w", "reset", "on", "nopass", "~*", "&*", "+@all"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("aclArgs without password and rules = %q, want %q", got, want)
	}
}

func TestNewRedisSecurityRejects(t *testing.T) {
	for name, tc := range map[string]struct {
		users          []RedisUser
		password       string
		disableDefault bool
		requireCert    bool
	}{
		"password and disabled default":  {password: "p", disableDefault: true},
		"default user and password":      {users: []RedisUser{{Name: "default"}}, password: "p"},
		"reserved admin name":            {users: []RedisUser{{Name: RedisAdminUser}}},
		"duplicate user":                 {users: []RedisUser{{Name: "a"}, {Name: "a"}}},
		"name with a space":              {users: []RedisUser{{Name: "a b"}}},
		"client certificate without TLS": {requireCert: true},
	} {
		if _, err := newRedisSecurity(nil, tc.requireCert, tc.users, tc.password, tc.disableDefault); err == nil {
			t.Errorf("%s: newRedisSecurity succeeded, want an error", name)
		}
	}
}

func TestParseClusterNodes(t *testing.T) {
	const nodes = `a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460 [5461->-b2]
b2 127.0.0.1:7002@17002 master,fail? - 0 0 2 connected 5461-10921 12000
c3 127.0.0.1:7003@17003 slave a1 0 0 1 connected
`
	entries, myself := parseRedisClusterNodes(nodes)
	if myself != "a1" || len(entries) != 3 {
		t.Fatalf("myself %q, %d entries; want a1, 3", myself, len(entries))
	}
	a, b, c := entries["a1"], entries["b2"], entries["c3"]
	if a.role() != "master" || !reflect.DeepEqual(a.slots, []string{"0-5460"}) || a.slotCount() != 5461 {
		t.Errorf("a1 = %+v, want a master of 0-5460 without the migrating slot", a)
	}
	if !b.has("fail?") || b.slotCount() != 5462 || !b.ownsSlot(12000) || b.ownsSlot(11000) {
		t.Errorf("b2 = %+v, want a suspected master of 5461-10921 and 12000", b)
	}
	if c.role() != "replica" || c.master != "a1" || c.shape() != "replica of a1 slots " {
		t.Errorf("c3 = %+v (shape %q), want a replica of a1", c, c.shape())
	}
}

func TestParseRedisInfo(t *testing.T) {
	m := parseRedisInfo("# Replication\r\nrole:slave\r\nmaster_link_status:up\r\n\r\n")
	if m["role"] != "slave" || m["master_link_status"] != "up" {
		t.Errorf("parseRedisInfo = %v", m)
	}
}
