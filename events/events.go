// Package events publishes change events: every change of a counter's
// value goes to a Redis Stream per counter, each entry the key, the new
// value and the LSN it is exact at, so that a UI can push live counts
// without polling (docs/design.md §7, "Change events"; docs/fresh-reads.md).
//
// The flush produces them (package sink): before a flush transaction (or a
// piece of a big batch) commits, the fields of the keys it changes are
// added to an outbox set in Redis (Due) and their values read in the
// transaction's snapshot (Read); after the commit they are published
// (Publish), and the same script removes them from the outbox. A crash
// between the commit and the publication leaves them in the outbox, and
// the next session start publishes them again with the values read back
// from the target rows (Recover): at least once. A reset of the chain
// (Redis lost walcount's keys, another server history) publishes a gap
// entry (Gap): entries before it may be missing.
//
// The package is walcount's own code, not a stable API: it is importable
// only because Go makes a top-level package so.
package events

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/fresh"
	"github.com/walcount/walcount/internal/metrics"
)

// LSN is a PostgreSQL WAL position.
type LSN = pglogrepl.LSN

// DefaultMaxLen is events_maxlen's default: about how many entries each
// counter's stream keeps (XADD … MAXLEN ~).
const DefaultMaxLen = 100000

// batchEntries is the most entries one publication script adds, so that
// no script keeps Redis busy for long.
const batchEntries = 1000

// resetField is the outbox member of a counter a TRUNCATE barrier reset:
// "~reset:<counter>" (no counter name starts with '~').
const resetField = "~reset:"

// Stream is the name of counter's stream in slot's Redis key space: the
// slot's hash tag, so that the stream lives in the same Redis Cluster
// slot as the buffer.
func Stream(slot, counter string) string { return "walcount:{" + slot + "}:events:" + counter }

func outboxKey(slot string) string { return "walcount:{" + slot + "}:events-due" }

// lastKey is a hash of the last LSN published to each counter's stream
// (16 hex digits), which refuses an older publication.
func lastKey(slot string) string { return "walcount:{" + slot + "}:events-lsn" }

// offKey is a hash whose field "why" says change events were turned off
// (Probe): the next walcount that may publish starts with a gap entry.
func offKey(slot string) string { return "walcount:{" + slot + "}:events-off" }

// Keys returns the slot's keys other than the streams (teardown).
func Keys(slot string) []string { return []string{outboxKey(slot), lastKey(slot), offKey(slot)} }

// Drop deletes the slot's change events keys: the outbox, the last LSNs
// and the streams of counters (the default counter's when none is given).
func Drop(ctx context.Context, rdb redis.UniversalClient, slot string, counters []counter.Counter) error {
	if len(counters) == 0 {
		counters = []counter.Counter{counter.Default()}
	}
	keys := Keys(slot)
	for _, c := range counters {
		keys = append(keys, Stream(slot, c.Name))
	}
	if err := rdb.Del(ctx, keys...).Err(); err != nil {
		return fmt.Errorf("delete the change events' redis keys: %w", err)
	}
	return nil
}

// Options configure a Publisher.
type Options struct {
	Redis    redis.UniversalClient
	Slot     string
	Counters []counter.Counter
	// MaxLen bounds each stream (approximately); 0 turns events off.
	MaxLen  int64
	Metrics *metrics.Metrics
	Logger  *zap.Logger
}

// Publisher publishes the change events of one slot's counters. A nil
// *Publisher publishes nothing. Safe for concurrent use.
type Publisher struct {
	opt Options
	// covered are the counters with events: those fresh reads answer
	// exactly (fresh.InexactKind).
	covered map[string]bool
	// mu guards off, why change events are off for now ("" when on):
	// Probe sets it when walcount's Redis user may not run the commands
	// events need, so that an upgrade to a walcount with events keeps
	// the counters going with a Redis user set up before them.
	mu  sync.Mutex
	off string
}

// Commands are the Redis commands change events need of walcount's user
// beyond the buffer's: SADD, SSCAN and SREM on the outbox, XADD and XLEN
// on the streams.
var Commands = []string{"sadd", "sscan", "srem", "xadd", "xlen"}

// Probe runs each command of Commands on a probe key of the slot and
// turns change events off while walcount's Redis user may not run one of
// them (NOPERM), with a warning; it turns them on again, with a gap entry
// (the events while off are missing), once the user may. Call it at a
// session start, before anything is published, with W. It returns an
// error only for a failure other than a permission.
func (p *Publisher) Probe(ctx context.Context, w LSN) error {
	if p == nil {
		return nil
	}
	probe := "walcount:{" + p.opt.Slot + "}:events-probe"
	stream := probe + "-stream"
	var refused []string
	var first string
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"sadd", func() error { return p.opt.Redis.SAdd(ctx, probe, "probe").Err() }},
		{"sscan", func() error { return p.opt.Redis.SScan(ctx, probe, 0, "", 1).Err() }},
		{"srem", func() error { return p.opt.Redis.SRem(ctx, probe, "probe").Err() }},
		{"xadd", func() error {
			return p.opt.Redis.XAdd(ctx, &redis.XAddArgs{Stream: stream, MaxLen: 1, Approx: true, Values: []any{"probe", "1"}}).Err()
		}},
		{"xlen", func() error { return p.opt.Redis.XLen(ctx, stream).Err() }},
	} {
		err := c.run()
		switch {
		case err == nil:
		case isNoPerm(err):
			refused = append(refused, strings.ToUpper(c.name))
			if first == "" {
				first = err.Error()
			}
		default:
			return fmt.Errorf("change events: probe %s: %w", strings.ToUpper(c.name), err)
		}
	}
	_ = p.opt.Redis.Del(ctx, probe, stream).Err()
	why := ""
	if len(refused) > 0 {
		why = fmt.Sprintf("the Redis user may not run %s (%s)", strings.Join(refused, ", "), first)
	}
	p.mu.Lock()
	p.off = why
	p.mu.Unlock()
	if why != "" {
		p.opt.Logger.Warn("change events are off: grant walcount's Redis user the commands they need (walcount check prints the ACL rule); the counters are kept as before",
			zap.String("why", why))
		// Recorded for whichever walcount may publish next (this one
		// after a grant, or another): it starts with a gap entry.
		if err := p.opt.Redis.HSet(ctx, offKey(p.opt.Slot), "why", why).Err(); err != nil {
			return fmt.Errorf("change events: record that they are off: %w", err)
		}
		return nil
	}
	was, err := p.opt.Redis.HGet(ctx, offKey(p.opt.Slot), "why").Result()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("change events: read whether they were off: %w", err)
	}
	p.opt.Logger.Info("change events are on again; a gap entry says the changes while they were off have none", zap.String("was", was))
	if err := p.Gap(ctx, w, "change events were off"); err != nil {
		return err
	}
	return p.opt.Redis.Del(ctx, offKey(p.opt.Slot)).Err()
}

// Off returns why change events are off for now, "" when they are on.
func (p *Publisher) Off() string {
	if p == nil {
		return "events_maxlen is 0"
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.off
}

// on reports whether p publishes at all.
func (p *Publisher) on() bool { return p != nil && p.Off() == "" }

func isNoPerm(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "NOPERM") || strings.Contains(msg, "no permissions") ||
		strings.Contains(msg, "can't run this command") || strings.Contains(msg, "can't access")
}

// New returns a Publisher, nil when opt.MaxLen is 0 (events off).
func New(opt Options) *Publisher {
	if opt.MaxLen <= 0 {
		return nil
	}
	if opt.Metrics == nil {
		opt.Metrics = metrics.New()
	}
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	p := &Publisher{opt: opt, covered: map[string]bool{}}
	for _, c := range opt.Counters {
		if fresh.InexactKind(c, opt.Counters) == "" {
			p.covered[c.Name] = true
		}
	}
	return p
}

// Covers reports whether counter's changes are published.
func (p *Publisher) Covers(counter string) bool { return p.on() && p.covered[counter] }

// Streams returns the streams published to, by counter.
func (p *Publisher) Streams() map[string]string {
	out := map[string]string{}
	if p == nil {
		return out
	}
	for name := range p.covered {
		out[name] = Stream(p.opt.Slot, name)
	}
	return out
}

// Entry is one key's new value.
type Entry struct {
	Counter, Key string
	// Value is the column after the change, in the column's scale.
	Value string
	// Dirty: the key or its counter is marked dirty (or not backfilled
	// yet), as a fresh read would say.
	Dirty bool
}

// Batch is what one committed transaction publishes: its entries, all at
// LSN, and the counters a TRUNCATE barrier reset (a reset entry each,
// before the entries). Done are the outbox members it settles.
type Batch struct {
	LSN     LSN
	Resets  []string
	Entries []Entry
	Done    []string
}

// Empty reports whether b publishes nothing.
func (b Batch) Empty() bool { return len(b.Resets) == 0 && len(b.Entries) == 0 && len(b.Done) == 0 }

// Querier runs a statement: a flush transaction or a pool.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Due adds the fields (counter:key) and the reset counters of a
// transaction about to commit to the outbox, and returns the members it
// added: the next session start publishes whatever the outbox still holds
// (Recover), so a crash between the commit and Publish loses no event.
func (p *Publisher) Due(ctx context.Context, fields, resets []string) ([]string, error) {
	if !p.on() {
		return nil, nil
	}
	var members []string
	for _, f := range fields {
		if name, _, ok := counter.SplitField(f); ok && p.covered[name] {
			members = append(members, f)
		}
	}
	for _, name := range resets {
		if p.covered[name] {
			members = append(members, resetField+name)
		}
	}
	if len(members) == 0 {
		return nil, nil
	}
	_, err := p.opt.Redis.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for lo := 0; lo < len(members); lo += batchEntries {
			hi := min(lo+batchEntries, len(members))
			args := make([]any, hi-lo)
			for i, m := range members[lo:hi] {
				args[i] = m
			}
			pl.SAdd(ctx, outboxKey(p.opt.Slot), args...)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("change events: record the keys due: %w", err)
	}
	return members, nil
}

// Read reads the new values of the outbox members in q's snapshot, one
// statement per counter (counter.Resolved.Read, a fresh read's): a key
// whose delta is carried (its row was locked, or it is parked) did not
// change, nor did one with no target row; their events come with the
// flush that applies them. Members of counters not in targets, or
// without events, are settled without an entry. lsn is the LSN the snapshot is exact at (the
// transaction's W); zero takes the checkpoint the statement reads.
func (p *Publisher) Read(ctx context.Context, q Querier, targets map[string]*counter.Resolved, members []string, lsn LSN) (Batch, error) {
	b := Batch{LSN: lsn, Done: members}
	if p == nil {
		return b, nil
	}
	byCounter := map[string][]string{}
	for _, m := range members {
		if name, ok := cutReset(m); ok {
			if p.covered[name] {
				b.Resets = append(b.Resets, name)
			}
			continue
		}
		name, key, _ := counter.SplitField(m)
		// A member left by an earlier session may name a counter no
		// longer configured, or now of a kind without events.
		if targets[name] != nil && p.covered[name] {
			byCounter[name] = append(byCounter[name], key)
		}
	}
	names := make([]string, 0, len(byCounter))
	for name := range byCounter {
		names = append(names, name)
	}
	sort.Strings(names)
	sort.Strings(b.Resets)
	for _, name := range names {
		es, w, err := p.read(ctx, q, targets[name], byCounter[name])
		if err != nil {
			return Batch{}, err
		}
		if b.LSN == 0 {
			b.LSN = w
		}
		b.Entries = append(b.Entries, es...)
	}
	return b, nil
}

func cutReset(m string) (string, bool) {
	if len(m) > len(resetField) && m[:len(resetField)] == resetField {
		return m[len(resetField):], true
	}
	return "", false
}

// read reads one counter's keys.
func (p *Publisher) read(ctx context.Context, q Querier, res *counter.Resolved, keys []string) ([]Entry, LSN, error) {
	rows, err := q.Query(ctx, res.Read, keys, p.opt.Slot)
	if err != nil {
		return nil, 0, fmt.Errorf("change events: read counter %s: %w", res.Counter.Name, err)
	}
	defer rows.Close()
	var out []Entry
	var w LSN
	for i := 0; rows.Next(); i++ {
		var at, column, now *string
		var present, dirty bool
		var carried int64
		if err := rows.Scan(&at, &present, &column, &carried, &dirty, &now); err != nil {
			return nil, 0, fmt.Errorf("change events: read counter %s: %w", res.Counter.Name, err)
		}
		if at == nil {
			return nil, 0, fmt.Errorf("change events: walcount.checkpoint has no row for the slot %q", p.opt.Slot)
		}
		if w == 0 {
			if w, err = pglogrepl.ParseLSN(*at); err != nil {
				return nil, 0, fmt.Errorf("change events: %w", err)
			}
		}
		if !present || column == nil || carried != 0 || i >= len(keys) {
			continue
		}
		n, err := strconv.ParseInt(*column, 10, 64)
		if err != nil {
			return nil, 0, fmt.Errorf("change events: counter %s key %s: %w", res.Counter.Name, keys[i], err)
		}
		out = append(out, Entry{Counter: res.Counter.Name, Key: keys[i], Value: fresh.Scaled(n, res.Scale), Dirty: dirty})
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("change events: read counter %s: %w", res.Counter.Name, err)
	}
	return out, w, nil
}

// publishScript adds one batch's entries to the counters' streams and
// settles its outbox members, atomically. A stream whose last published
// LSN (KEYS[2]'s field) is past the batch's refuses its entries: a
// walcount that lost its session to another, publishing late, must not
// put old values after newer ones.
//
// KEYS: outbox, last, then one stream per group. ARGV: maxlen, lsn (16 hex
// digits), lsn (PostgreSQL's form), groups; per group: counter, reset
// ("1" or ""), n, then n (key, value, dirty) triples; then the outbox
// members to settle. It returns, per group, the stream's length, or -1
// when it refused the group.
var publishScript = redis.NewScript(`
local maxlen, hex, lsn, ng = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local i = 5
local out = {}
for g = 1, ng do
  local stream = KEYS[2 + g]
  local name, reset, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  i = i + 3
  local last = redis.call('HGET', KEYS[2], name)
  if last and last > hex then
    out[g] = -1
  else
    if reset == '1' then
      redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'reset', 'truncate', 'lsn', lsn)
    end
    for e = 0, n - 1 do
      local j = i + 3 * e
      if ARGV[j + 2] == '1' then
        redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'key', ARGV[j], 'value', ARGV[j + 1], 'lsn', lsn, 'dirty', '1')
      else
        redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'key', ARGV[j], 'value', ARGV[j + 1], 'lsn', lsn)
      end
    end
    redis.call('HSET', KEYS[2], name, hex)
    out[g] = redis.call('XLEN', stream)
  end
  i = i + 3 * n
end
if i <= #ARGV then
  redis.call('SREM', KEYS[1], unpack(ARGV, i, #ARGV))
end
return out
`)

// Publish adds b's entries to the streams and settles b.Done in the
// outbox, in script calls of at most batchEntries entries.
func (p *Publisher) Publish(ctx context.Context, b Batch) error {
	if !p.on() || b.Empty() {
		return nil
	}
	resets := map[string]bool{}
	for _, name := range b.Resets {
		resets[name] = true
	}
	entries := b.Entries
	done := b.Done
	first := true
	for first || len(entries) > 0 || len(done) > 0 {
		n := min(len(entries), batchEntries)
		part, rest := entries[:n], entries[n:]
		m := min(len(done), batchEntries)
		var r map[string]bool
		if first {
			r = resets
		}
		if err := p.run(ctx, b.LSN, r, part, done[:m]); err != nil {
			return err
		}
		entries, done, first = rest, done[m:], false
	}
	return nil
}

// run is one call of publishScript.
func (p *Publisher) run(ctx context.Context, lsn LSN, resets map[string]bool, entries []Entry, done []string) error {
	byCounter := map[string][]Entry{}
	var names []string
	for _, e := range entries {
		if _, ok := byCounter[e.Counter]; !ok {
			names = append(names, e.Counter)
		}
		byCounter[e.Counter] = append(byCounter[e.Counter], e)
	}
	for name := range resets {
		if _, ok := byCounter[name]; !ok {
			names = append(names, name)
			byCounter[name] = nil
		}
	}
	sort.Strings(names)
	keys := []string{outboxKey(p.opt.Slot), lastKey(p.opt.Slot)}
	args := []any{p.opt.MaxLen, buffer.FormatLSN(lsn), lsn.String(), len(names)}
	for _, name := range names {
		keys = append(keys, Stream(p.opt.Slot, name))
		reset := ""
		if resets[name] {
			reset = "1"
		}
		args = append(args, name, reset, len(byCounter[name]))
		for _, e := range byCounter[name] {
			dirty := ""
			if e.Dirty {
				dirty = "1"
			}
			args = append(args, e.Key, e.Value, dirty)
		}
	}
	for _, m := range done {
		args = append(args, m)
	}
	lens, err := publishScript.Run(ctx, p.opt.Redis, keys, args...).Int64Slice()
	if err != nil {
		return fmt.Errorf("change events: publish at %s: %w", lsn, err)
	}
	for g, name := range names {
		if g >= len(lens) {
			break
		}
		if lens[g] < 0 {
			p.opt.Metrics.EventsStale.Add(float64(len(byCounter[name])))
			p.opt.Logger.Warn("change events refused: the stream holds a later LSN (another walcount published after this one)",
				zap.String("counter", name), zap.String("lsn", lsn.String()))
			continue
		}
		p.opt.Metrics.EventsPublished.WithLabelValues(name).Add(float64(len(byCounter[name])))
		p.opt.Metrics.EventsStreamLength.WithLabelValues(name).Set(float64(lens[g]))
	}
	return nil
}

// Recover publishes what the outbox still holds: the keys of a
// transaction that committed (or may have) without its events reaching
// Redis, with their values read back from the target rows at the
// checkpoint. Call it at a session start, before the first flush, when
// nothing else writes the columns. It returns the entries published.
func (p *Publisher) Recover(ctx context.Context, q Querier, targets map[string]*counter.Resolved) (int, error) {
	if !p.on() {
		return 0, nil
	}
	var members []string
	iter := p.opt.Redis.SScan(ctx, outboxKey(p.opt.Slot), 0, "", 1000).Iterator()
	for iter.Next(ctx) {
		members = append(members, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return 0, fmt.Errorf("change events: read the keys due: %w", err)
	}
	if len(members) == 0 {
		return 0, nil
	}
	sort.Strings(members)
	members = dedupe(members)
	b, err := p.Read(ctx, q, targets, members, 0)
	if err != nil {
		return 0, err
	}
	if b.LSN == 0 {
		// Only members of counters no longer configured, or resets.
		w, err := readCheckpoint(ctx, q, p.opt.Slot)
		if err != nil {
			return 0, err
		}
		b.LSN = w
	}
	if err := p.Publish(ctx, b); err != nil {
		return 0, err
	}
	p.opt.Metrics.EventsRecovered.Add(float64(len(b.Entries) + len(b.Resets)))
	p.opt.Logger.Info("change events published again for keys a crash may have kept from redis",
		zap.Int("entries", len(b.Entries)), zap.String("lsn", b.LSN.String()))
	return len(b.Entries), nil
}

func dedupe(sorted []string) []string {
	out := sorted[:0]
	for i, s := range sorted {
		if i == 0 || s != sorted[i-1] {
			out = append(out, s)
		}
	}
	return out
}

func readCheckpoint(ctx context.Context, q Querier, slot string) (LSN, error) {
	rows, err := q.Query(ctx, `SELECT lsn::text FROM walcount.checkpoint WHERE slot_name = $1`, slot)
	if err != nil {
		return 0, fmt.Errorf("change events: read the checkpoint: %w", err)
	}
	s, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("change events: read the checkpoint: %w", err)
	}
	return pglogrepl.ParseLSN(s)
}

// gapScript adds a gap entry to each stream and sets its last LSN to the
// gap's, whatever it was: a new chain (another server history may have
// taken W back) starts a new order. KEYS: last, then the streams. ARGV:
// maxlen, lsn (hex), lsn, reason, then the counters.
var gapScript = redis.NewScript(`
for g = 1, #KEYS - 1 do
  redis.call('XADD', KEYS[g + 1], 'MAXLEN', '~', ARGV[1], '*', 'gap', ARGV[4], 'lsn', ARGV[3])
  redis.call('HSET', KEYS[1], ARGV[4 + g], ARGV[2])
end
return 0
`)

// Gap publishes a gap entry at lsn to every stream: the chain was reset,
// so events of flushes before it may be missing (their outbox members
// went with walcount's other keys). A consumer reads its keys again.
func (p *Publisher) Gap(ctx context.Context, lsn LSN, reason string) error {
	if !p.on() || len(p.covered) == 0 {
		return nil
	}
	names := make([]string, 0, len(p.covered))
	for name := range p.covered {
		names = append(names, name)
	}
	sort.Strings(names)
	keys := []string{lastKey(p.opt.Slot)}
	args := []any{p.opt.MaxLen, buffer.FormatLSN(lsn), lsn.String(), reason}
	for _, name := range names {
		keys = append(keys, Stream(p.opt.Slot, name))
		args = append(args, name)
	}
	if err := gapScript.Run(ctx, p.opt.Redis, keys, args...).Err(); err != nil {
		return fmt.Errorf("change events: publish a gap at %s: %w", lsn, err)
	}
	p.opt.Metrics.EventsGaps.Inc()
	return nil
}

// Lengths returns each stream's length (XLEN), by counter.
func (p *Publisher) Lengths(ctx context.Context) (map[string]int64, error) {
	out := map[string]int64{}
	if !p.on() {
		return out, nil
	}
	cmds := map[string]*redis.IntCmd{}
	_, err := p.opt.Redis.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for name := range p.covered {
			cmds[name] = pl.XLen(ctx, Stream(p.opt.Slot, name))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("change events: read the streams' lengths: %w", err)
	}
	for name, c := range cmds {
		out[name] = c.Val()
	}
	return out, nil
}

// MaxLen returns the streams' bound.
func (p *Publisher) MaxLen() int64 {
	if p == nil {
		return 0
	}
	return p.opt.MaxLen
}
