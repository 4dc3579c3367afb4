package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/internal/redisconn"
	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// event is one entry of a counter's change events stream.
type event struct {
	id, key, value, lsn, gap, reset string
	dirty                           bool
}

func eventsClient(t *testing.T, url string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// eventsStream is the stream of counter's change events (docs/fresh-reads.md).
func eventsStream(slot, counter string) string { return "walcount:{" + slot + "}:events:" + counter }

// readEvents returns the entries of stream after the id after ("-" for
// all).
func readEvents(t *testing.T, rdb *redis.Client, stream, after string) []event {
	t.Helper()
	start := "-"
	if after != "-" {
		start = "(" + after
	}
	msgs, err := rdb.XRange(context.Background(), stream, start, "+").Result()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", stream, err)
	}
	out := make([]event, 0, len(msgs))
	for _, m := range msgs {
		e := event{id: m.ID}
		e.key, _ = m.Values["key"].(string)
		e.value, _ = m.Values["value"].(string)
		e.lsn, _ = m.Values["lsn"].(string)
		e.gap, _ = m.Values["gap"].(string)
		e.reset, _ = m.Values["reset"].(string)
		e.dirty = m.Values["dirty"] == "1"
		if e.lsn == "" {
			t.Errorf("entry %s of %s has no lsn: %v", m.ID, stream, m.Values)
		}
		out = append(out, e)
	}
	return out
}

// checkEventOrder fails on a key whose entries go back in LSN order.
func checkEventOrder(t *testing.T, es []event) {
	t.Helper()
	last := map[string]uint64{}
	for _, e := range es {
		if e.key == "" {
			continue
		}
		if l := lsnOf(e.lsn); l < last[e.key] {
			t.Errorf("entry %s: key %s at lsn %s after an entry at %X: out of LSN order", e.id, e.key, e.lsn, last[e.key])
		} else {
			last[e.key] = l
		}
	}
}

// TestChangeEvents likes posts in rounds, each round waiting until a
// flush put the round's likes in the columns: every flush in which a key
// changed publishes an entry to the counter's stream with the key, the
// column after the flush and an LSN at or below the checkpoint, in LSN
// order per key; the max counter, which fresh reads refuse, has no
// stream; a TRUNCATE of the source publishes a reset entry; /metrics and
// walcount status show the events and the stream's length.
func TestChangeEvents(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), appschema.SQL(appschema.Options{
		PostsColumns: "last_like bigint", LikesColumns: "n bigint NOT NULL DEFAULT 0", Index: true, Posts: 4}))
	path := c.writeConfig(`
counters:
  - {name: post_likes, source: likes, key: post_id, target: posts, target_key: id, column: likes_count}
  - {name: post_last, source: likes, key: post_id, target: posts, target_key: id, column: last_like, max: n}
`)
	addr := unusedAddr(t)
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot,
		"WALCOUNT_HTTP_ADDR=" + addr, "WALCOUNT_FLUSH_INTERVAL=100ms", "WALCOUNT_CONFIG=" + path}
	if code, _, _ := walcount(t, env, "setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	p := startWalcount(t, env, "run")
	waitStreaming(t, p, addr)
	rdb := eventsClient(t, c.redis)
	stream := eventsStream(c.slot, "post_likes")

	// The values each key's column took, round after round.
	took := map[string][]string{}
	for round := range 6 {
		post := 1 + round%3
		c.exec(fmt.Sprintf("INSERT INTO likes (post_id, n) SELECT %d, g FROM generate_series(1, %d) g", post, round+1))
		want := c.count("SELECT count(*) FROM likes WHERE post_id = $1", post)
		wait.For(t, time.Minute, "the round's likes flushed", func() bool {
			return c.count("SELECT likes_count FROM posts WHERE id = $1", post) == want
		})
		key := strconv.Itoa(post)
		took[key] = append(took[key], strconv.Itoa(want))
	}
	var es []event
	wait.For(t, time.Minute, "an entry for every value a column took", func() bool {
		es = readEvents(t, rdb, stream, "-")
		for key, values := range took {
			seen := map[string]bool{}
			for _, e := range es {
				if e.key == key {
					seen[e.value] = true
				}
			}
			for _, v := range values {
				if !seen[v] {
					return false
				}
			}
		}
		return true
	})
	checkEventOrder(t, es)
	var w string
	if err := c.conn.QueryRow(context.Background(), "SELECT lsn::text FROM walcount.checkpoint WHERE slot_name = $1", c.slot).Scan(&w); err != nil {
		t.Fatal(err)
	}
	last := map[string]event{}
	for _, e := range es {
		if e.key == "4" {
			t.Errorf("entry %v for post 4, which never changed", e)
		}
		if lsnOf(e.lsn) > lsnOf(w) {
			t.Errorf("entry %v past the checkpoint %s", e, w)
		}
		last[e.key] = e
	}
	for key := range took {
		if col := strconv.Itoa(c.count("SELECT likes_count FROM posts WHERE id = $1::bigint", key)); last[key].value != col {
			t.Errorf("post %s: last entry %v, column %s", key, last[key], col)
		}
	}
	// A TRUNCATE of the source is one reset entry: every key 0 at its LSN.
	c.exec("TRUNCATE likes")
	wait.For(t, time.Minute, "a reset entry after the TRUNCATE", func() bool {
		for _, e := range readEvents(t, rdb, stream, last["1"].id) {
			if e.reset == "truncate" {
				return c.count("SELECT count(*) FROM posts WHERE likes_count <> 0") == 0
			}
		}
		return false
	})
	if n, err := rdb.Exists(context.Background(), eventsStream(c.slot, "post_last")).Result(); err != nil || n != 0 {
		t.Errorf("the max counter has a stream (exists %d, %v): fresh reads refuse it, so do events", n, err)
	}

	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`walcount_events_published_total{counter="post_likes"}`, `walcount_events_stream_length{counter="post_likes"}`} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
	_, out, _ := walcount(t, env, "status")
	var line string
	for l := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "change events") {
			line = l
		}
	}
	if n, err := rdb.XLen(context.Background(), stream).Result(); err != nil || !strings.Contains(line, stream) || !strings.Contains(line, fmt.Sprintf("%d entries", n)) {
		t.Errorf("status's change events line %q does not name %s with its length (%d, %v):\n%s", line, stream, n, err, out)
	}
}

// failpointBinary builds walcount with the walcountfailpoints tag: its
// WALCOUNT_TEST_FAILPOINT names a failpoint at which it stops and waits
// to be killed.
var failpointBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "walcount-failpoints-")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "walcount")
	if out, err := exec.Command("go", "build", "-tags", "walcountfailpoints", "-o", path, ".").CombinedOutput(); err != nil {
		return "", fmt.Errorf("%v\n%s", err, out)
	}
	return path, nil
})

// TestChangeEventsAfterKill9BetweenCommitAndPublish stops the real binary
// at the failpoint between a flush's PostgreSQL commit and its events,
// kills it with SIGKILL there, and starts walcount again: the key's entry,
// its value the column the killed flush committed, is published by the
// next start (at least once).
func TestChangeEventsAfterKill9BetweenCommitAndPublish(t *testing.T) {
	t.Parallel()
	bin, err := failpointBinary()
	if err != nil {
		t.Fatalf("build walcount with failpoints: %v", err)
	}
	c := newCLI(t, testenv.Database(t), appschema.SQL(appschema.Options{Index: true, Posts: 2}))
	addr := unusedAddr(t)
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot,
		"WALCOUNT_HTTP_ADDR=" + addr, "WALCOUNT_FLUSH_INTERVAL=100ms"}
	if code, _, _ := walcount(t, env, "setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	p := &proc{t: t, cmd: exec.Command(bin, "run"), done: make(chan struct{})}
	p.cmd.Env = walcountEnv(append(env, "WALCOUNT_TEST_FAILPOINT=sink.before-events")...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		_ = p.cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	waitStreaming(t, p, addr)
	c.exec("INSERT INTO likes (post_id) SELECT 1 FROM generate_series(1, 3)")
	wait.For(t, time.Minute, "the flush stopped between its commit and its events", func() bool {
		return strings.Contains(p.stderr.String(), "failpoint sink.before-events reached")
	})
	if n := c.count("SELECT likes_count FROM posts WHERE id = 1"); n != 3 {
		t.Fatalf("post 1's column is %d at the failpoint, want the committed 3", n)
	}
	rdb := eventsClient(t, c.redis)
	stream := eventsStream(c.slot, "post_likes")
	for _, e := range readEvents(t, rdb, stream, "-") {
		if e.key != "" {
			t.Fatalf("an entry before the events were published: %v", e)
		}
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done

	last := startWalcount(t, env, "run")
	waitStreaming(t, last, addr)
	var es []event
	wait.For(t, time.Minute, "post 1's entry published by the next start", func() bool {
		es = readEvents(t, rdb, stream, "-")
		for _, e := range es {
			if e.key == "1" && e.value == "3" {
				return true
			}
		}
		return false
	})
	checkEventOrder(t, es)
	if m := metricValue(t, addr, "walcount_events_recovered_total"); m < 1 {
		t.Errorf("walcount_events_recovered_total is %v after the entry was published again", m)
	}
}

// metricValue is the value of an unlabelled metric of the daemon at addr.
func metricValue(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for l := range strings.SplitSeq(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return 0
}

// consumer keeps the counts of some keys from the change events, as a
// UI's backend would.
type consumer struct {
	t       *testing.T
	rdb     *redis.Client
	stream  string
	addr    string
	keys    []string
	last    string            // the id of the last entry read
	value   map[string]string // what it shows
	at      map[string]uint64 // the LSN of what it shows
	resyncs int
}

// resync is how docs/fresh-reads.md says to resume after a gap: note the
// stream's last id, read every key fresh (exact at one LSN), then go on
// from the noted id, skipping entries at or below what is held.
func (c *consumer) resync() {
	c.t.Helper()
	c.resyncs++
	c.last = "0"
	if top, err := c.rdb.XRevRangeN(context.Background(), c.stream, "+", "-", 1).Result(); err != nil {
		c.t.Fatal(err)
	} else if len(top) == 1 {
		c.last = top[0].ID
	}
	resp, err := http.Get("http://" + c.addr + "/v1/counters/post_likes?keys=" + strings.Join(c.keys, ","))
	if err != nil {
		c.t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var a struct {
		LSN    string                     `json:"lsn"`
		Values map[string]json.RawMessage `json:"values"`
	}
	if err := json.Unmarshal(raw, &a); err != nil || resp.StatusCode != http.StatusOK {
		c.t.Fatalf("fresh read: %d %v %s", resp.StatusCode, err, raw)
	}
	for _, k := range c.keys {
		c.value[k] = string(a.Values[k])
		c.at[k] = lsnOf(a.LSN)
	}
}

// follow reads the entries after the last one read; a gap (its last entry
// trimmed away, or a gap entry) makes it resync.
func (c *consumer) follow() {
	c.t.Helper()
	if c.last == "" {
		c.resync()
	}
	if c.last != "0" {
		// Trimmed past the last entry read: the stream's first entry is
		// newer (which may lose nothing, when the trim stopped right
		// after it; a resync costs one read).
		first, err := c.rdb.XRangeN(context.Background(), c.stream, "-", "+", 1).Result()
		if err != nil {
			c.t.Fatal(err)
		}
		if len(first) == 1 && idLess(c.last, first[0].ID) {
			c.resync()
		}
	}
	es := readEvents(c.t, c.rdb, c.stream, c.last)
	for _, e := range es {
		c.last = e.id
		if e.gap != "" || e.reset != "" {
			c.resync()
			c.follow()
			return
		}
		if l := lsnOf(e.lsn); l > c.at[e.key] {
			c.value[e.key], c.at[e.key] = e.value, l
		}
	}
}

func idLess(a, b string) bool {
	am, as, _ := strings.Cut(a, "-")
	bm, bs, _ := strings.Cut(b, "-")
	ami, _ := strconv.ParseUint(am, 10, 64)
	bmi, _ := strconv.ParseUint(bm, 10, 64)
	if ami != bmi {
		return ami < bmi
	}
	asi, _ := strconv.ParseUint(as, 10, 64)
	bsi, _ := strconv.ParseUint(bs, 10, 64)
	return asi < bsi
}

// TestChangeEventsResumeAfterGap follows the events of 300 posts with a
// consumer that stops reading while a burst of likes overflows the
// stream's bound (events_maxlen), and then while Redis loses walcount's
// keys: each time it sees the gap (its last entry trimmed away, a gap
// entry), resumes as docs/fresh-reads.md says, and ends up showing every
// post's column.
func TestChangeEventsResumeAfterGap(t *testing.T) {
	t.Parallel()
	const posts = 300
	c := newCLI(t, testenv.Database(t), appschema.SQL(appschema.Options{Index: true, Posts: posts}))
	path := c.writeConfig("events_maxlen: 100\n")
	addr := unusedAddr(t)
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + c.redis, "WALCOUNT_SLOT=" + c.slot,
		"WALCOUNT_HTTP_ADDR=" + addr, "WALCOUNT_FLUSH_INTERVAL=100ms", "WALCOUNT_CONFIG=" + path}
	if code, _, _ := walcount(t, env, "setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	p := startWalcount(t, env, "run")
	waitStreaming(t, p, addr)
	rdb := eventsClient(t, c.redis)
	stream := eventsStream(c.slot, "post_likes")
	keys := make([]string, posts)
	for i := range keys {
		keys[i] = strconv.Itoa(i + 1)
	}
	cs := &consumer{t: t, rdb: rdb, stream: stream, addr: addr, keys: keys, value: map[string]string{}, at: map[string]uint64{}}
	settled := func(what string) {
		t.Helper()
		c.settlesExact(offPosts, "posts")
		wait.For(t, time.Minute, "the consumer shows every column ("+what+")", func() bool {
			cs.follow()
			for _, k := range keys {
				if cs.value[k] != strconv.Itoa(c.count("SELECT likes_count FROM posts WHERE id = $1::bigint", k)) {
					return false
				}
			}
			return true
		})
	}

	c.exec("INSERT INTO likes (post_id) SELECT 1 + g % 10 FROM generate_series(1, 40) g")
	settled("a few posts liked")
	before := cs.resyncs
	// A burst over every post, twice, in transactions of their own: more
	// entries than the stream keeps.
	for range 2 {
		c.exec(fmt.Sprintf("INSERT INTO likes (post_id) SELECT g FROM generate_series(1, %d) g", posts))
		c.settlesExact(offPosts, "posts")
	}
	if n, err := rdb.XLen(context.Background(), stream).Result(); err != nil || n >= 2*posts {
		t.Fatalf("the stream holds %d entries (%v): events_maxlen 100 did not bound it", n, err)
	}
	settled("after the burst")
	if cs.resyncs == before {
		t.Errorf("the consumer never saw the trimmed entries as a gap")
	}

	// Redis loses walcount's keys: the next session starts a new chain,
	// and its stream begins with a gap entry.
	before = cs.resyncs
	var cursor uint64
	for {
		ks, next, err := rdb.Scan(context.Background(), cursor, "walcount:{"+c.slot+"}:*", 100).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(ks) > 0 {
			rdb.Del(context.Background(), ks...)
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	c.exec("INSERT INTO likes (post_id) SELECT 1 + g % 7 FROM generate_series(1, 20) g")
	wait.For(t, time.Minute, "a gap entry", func() bool {
		for _, e := range readEvents(t, rdb, stream, "-") {
			if e.gap != "" {
				return true
			}
		}
		return false
	})
	settled("after Redis lost walcount's keys")
	if cs.resyncs == before {
		t.Errorf("the consumer never resynced after Redis lost walcount's keys")
	}
}

// TestChangeEventsOffForAnOlderRedisUser: walcount's Redis user was set up
// before change events (the least-privilege rule without SADD, SSCAN,
// SREM, XADD and XLEN), as an upgrade finds it. walcount run keeps the
// counters exact with events off, says so in walcount status, and
// publishes nothing; once the commands are granted, the next start turns
// events on with a gap entry (the changes while off have none) and
// publishes again. Before, run refused to start until they were granted:
// the upgrade stopped every counter.
func TestChangeEventsOffForAnOlderRedisUser(t *testing.T) {
	t.Parallel()
	c := newCLI(t, testenv.Database(t), appschema.SQL(appschema.Options{Index: true, Posts: 3}))
	ctx := context.Background()
	rdb := eventsClient(t, c.redis)
	opts, err := redisconn.Parse(c.redis, redisconn.TLSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var rules []any
	for _, r := range strings.Fields(redisconn.ACLRules(opts)) {
		if !slices.Contains([]string{"+sadd", "+sscan", "+srem", "+xadd", "+xlen"}, r) {
			rules = append(rules, r)
		}
	}
	user := "old_" + c.slot
	if err := rdb.Do(ctx, append([]any{"ACL", "SETUSER", user, ">pw"}, rules...)...).Err(); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(c.redis)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, "pw")
	addr := unusedAddr(t)
	env := []string{"WALCOUNT_DATABASE_URL=" + c.db, "WALCOUNT_REDIS_URL=" + u.String(), "WALCOUNT_SLOT=" + c.slot,
		"WALCOUNT_HTTP_ADDR=" + addr, "WALCOUNT_FLUSH_INTERVAL=100ms"}
	if code, _, _ := walcount(t, env, "setup"); code != exitOK {
		t.Fatalf("setup: exit %d", code)
	}
	code, out, _ := walcount(t, env, "check")
	if code != exitOK || !strings.Contains(out, "which change events need") {
		t.Fatalf("check as the older user: exit %d, want %d with a warning naming change events:\n%s", code, exitOK, out)
	}
	p := startWalcount(t, env, "run")
	waitStreaming(t, p, addr)
	c.exec("INSERT INTO likes (post_id) SELECT 1 + g % 3 FROM generate_series(1, 30) g")
	wait.For(t, time.Minute, "the likes flushed", func() bool {
		return c.count("SELECT count(*) FROM posts WHERE likes_count = 10") == 3
	})
	_, status, _ := walcount(t, env, "status")
	if !strings.Contains(status, "WARNING off: the Redis user may not run SADD") {
		t.Errorf("status does not say change events are off:\n%s", status)
	}
	stream := eventsStream(c.slot, "post_likes")
	if n, err := rdb.Exists(ctx, stream).Result(); err != nil || n != 0 {
		t.Fatalf("a stream exists while events are off (exists %d, %v)", n, err)
	}
	if code := p.stop(); code != exitOK {
		t.Fatalf("run exit %d", code)
	}

	// Granted: the next start publishes a gap entry, then the changes.
	if err := rdb.Do(ctx, "ACL", "SETUSER", user, "+sadd", "+sscan", "+srem", "+xadd", "+xlen").Err(); err != nil {
		t.Fatal(err)
	}
	p = startWalcount(t, env, "run")
	waitStreaming(t, p, addr)
	c.exec("INSERT INTO likes (post_id) VALUES (1)")
	wait.For(t, time.Minute, "a gap entry, then post 1's entry at 11", func() bool {
		es := readEvents(t, rdb, stream, "-")
		return len(es) >= 2 && es[0].gap != "" && slices.ContainsFunc(es[1:], func(e event) bool { return e.key == "1" && e.value == "11" })
	})
	if code := p.stop(); code != exitOK {
		t.Fatalf("run exit %d", code)
	}
}
