package buffer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/counter"
)

// LSN is a PostgreSQL WAL position.
type LSN = pglogrepl.LSN

var (
	// ErrChainBroken means Redis does not hold a chain that starts at W:
	// its keys are gone or belong to another history. The caller resets
	// the buffer with Reset and restarts streaming from W.
	ErrChainBroken = errors.New("redis buffer does not continue the checkpoint (data lost or stale)")
)

// Keys are the Redis keys of one slot.
type Keys struct {
	Buffer, Flushing, Meta string
}

// KeysFor returns the keys of slot. They share the hash tag {<slot>}.
func KeysFor(slot string) Keys {
	p := "walcount:{" + slot + "}:"
	return Keys{Buffer: p + "buffer", Flushing: p + "flushing", Meta: p + "meta"}
}

// All returns the keys as a slice, for DEL and EXISTS.
func (k Keys) All() []string { return []string{k.Buffer, k.Flushing, k.Meta} }

// FormatLSN renders an LSN as 16 hex digits, the form stored in Redis.
func FormatLSN(l LSN) string { return fmt.Sprintf("%016X", uint64(l)) }

// ParseLSN parses FormatLSN's output.
func ParseLSN(s string) (LSN, error) {
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("parse stored lsn %q: %w", s, err)
	}
	return LSN(v), nil
}

// applyScript adds a batch of deltas and moves meta.lsn from prev to last,
// atomically. A batch at or below meta.lsn was already applied and is
// ignored (a replay); a batch that does not start at meta.lsn would leave
// a hole and is refused. Rows never share a batch boundary, so this
// compares whole transactions, never rows (DESIGN §2 rule 5).
var applyScript = redis.NewScript(`
local lsn = redis.call('HGET', KEYS[2], 'lsn')
if not lsn then return redis.error_reply('WALCOUNT_CHAIN no meta') end
if lsn >= ARGV[2] then return 0 end
if lsn ~= ARGV[1] then return redis.error_reply('WALCOUNT_CHAIN meta.lsn ' .. lsn .. ' is not ' .. ARGV[1]) end
for i = 3, #ARGV, 2 do
  if redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i+1]) == 0 then
    redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
redis.call('HSET', KEYS[2], 'lsn', ARGV[2])
return 1
`)

// handOverScript starts or resumes a flush. With a flush in progress it
// returns that flush's range (ffrom, fupto) if it starts at W; if it ends
// at or below W it was already committed and is cleaned up first. Else it
// renames buffer to flushing and records the range (W, lsn]. It returns
// an empty list when there is nothing past W (DESIGN §2 rule 6).
var handOverScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[3], 'lsn', 'base', 'ffrom', 'fupto')
if not m[1] then return redis.error_reply('WALCOUNT_CHAIN no meta') end
if m[4] then
  if m[3] == ARGV[1] then return {m[3], m[4]} end
  if m[4] <= ARGV[1] then
    redis.call('DEL', KEYS[2])
    redis.call('HDEL', KEYS[3], 'ffrom', 'fupto')
    redis.call('HSET', KEYS[3], 'base', m[4])
    m[2] = m[4]
  else
    return redis.error_reply('WALCOUNT_CHAIN flushing starts at ' .. m[3] .. ', checkpoint is ' .. ARGV[1])
  end
end
if m[2] ~= ARGV[1] then return redis.error_reply('WALCOUNT_CHAIN buffer starts at ' .. tostring(m[2]) .. ', checkpoint is ' .. ARGV[1]) end
if m[1] == ARGV[1] then return {} end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('RENAME', KEYS[1], KEYS[2]) end
redis.call('HSET', KEYS[3], 'ffrom', ARGV[1], 'fupto', m[1])
return {ARGV[1], m[1]}
`)

// doneScript ends a flush after its PostgreSQL commit: the flushing hash
// goes and the buffer chain now starts at fupto.
var doneScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[2], 'ffrom', 'fupto')
if m[1] ~= ARGV[1] or m[2] ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HDEL', KEYS[2], 'ffrom', 'fupto')
redis.call('HSET', KEYS[2], 'base', ARGV[2])
return 1
`)

// advanceScript moves an empty chain from W to a new W that PostgreSQL
// reached without Redis (a TRUNCATE barrier). It refuses when anything is
// buffered, since that would be skipped.
var advanceScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[2], 'lsn', 'base', 'fupto')
if m[1] ~= ARGV[1] or m[2] ~= ARGV[1] or m[3] or redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.error_reply('WALCOUNT_CHAIN buffer is not empty at ' .. ARGV[1])
end
redis.call('HSET', KEYS[2], 'lsn', ARGV[2], 'base', ARGV[2])
return 1
`)

// Meta is the decoded meta hash.
type Meta struct {
	// Exists is false when the meta key is missing.
	Exists bool
	// LSN is the end LSN of the last transaction whose deltas are in
	// Redis or PostgreSQL.
	LSN LSN
	// Base is where the buffer's chain starts.
	Base LSN
	// Flushing is true while a hand-over is not finished; From and Upto
	// are its range.
	Flushing   bool
	From, Upto LSN
}

// Redis is walcount's buffer for one slot, kept in Redis. It is safe for
// concurrent use; the protocol itself assumes one walcount per slot.
type Redis struct {
	rdb  redis.UniversalClient
	keys Keys
}

// New returns the buffer of slot on rdb: a single node, a Cluster or a
// Sentinel-watched primary, through go-redis's UniversalClient.
func New(rdb redis.UniversalClient, slot string) *Redis {
	return &Redis{rdb: rdb, keys: KeysFor(slot)}
}

// Keys returns the buffer's keys.
func (b *Redis) Keys() Keys { return b.keys }

// chainErr turns a script's WALCOUNT_CHAIN reply into ErrChainBroken.
func chainErr(op string, err error) error {
	if err == nil {
		return nil
	}
	if strings.Contains(err.Error(), "WALCOUNT_CHAIN") {
		msg := err.Error()
		if i := strings.Index(msg, "WALCOUNT_CHAIN "); i >= 0 {
			msg = msg[i+len("WALCOUNT_CHAIN "):]
		}
		return fmt.Errorf("%s: %w: %s", op, ErrChainBroken, msg)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// Apply adds deltas for the transactions in (prev, last] and moves
// meta.lsn to last. It reports false when the batch was already applied.
func (b *Redis) Apply(ctx context.Context, prev, last LSN, deltas []counter.Delta) (bool, error) {
	args := make([]any, 0, 2+2*len(deltas))
	args = append(args, FormatLSN(prev), FormatLSN(last))
	for _, d := range deltas {
		if d.N != 0 {
			args = append(args, d.Field, d.N)
		}
	}
	n, err := applyScript.Run(ctx, b.rdb, []string{b.keys.Buffer, b.keys.Meta}, args...).Int()
	if err != nil {
		return false, chainErr("apply deltas to redis", err)
	}
	return n == 1, nil
}

// HandOver starts or resumes a flush from w. It returns the range of the
// flush, or ok == false when nothing lies past w.
func (b *Redis) HandOver(ctx context.Context, w LSN) (from, upto LSN, ok bool, err error) {
	res, err := handOverScript.Run(ctx, b.rdb, b.keys.All(), FormatLSN(w)).StringSlice()
	if err != nil {
		return 0, 0, false, chainErr("hand over redis buffer", err)
	}
	if len(res) == 0 {
		return 0, 0, false, nil
	}
	if from, err = ParseLSN(res[0]); err != nil {
		return 0, 0, false, err
	}
	if upto, err = ParseLSN(res[1]); err != nil {
		return 0, 0, false, err
	}
	return from, upto, true, nil
}

// Flushing reads the deltas being flushed.
func (b *Redis) Flushing(ctx context.Context) (map[string]string, error) {
	m, err := b.rdb.HGetAll(ctx, b.keys.Flushing).Result()
	if err != nil {
		return nil, fmt.Errorf("read flushing deltas: %w", err)
	}
	return m, nil
}

// Done ends the flush of (from, upto] after its PostgreSQL commit.
func (b *Redis) Done(ctx context.Context, from, upto LSN) error {
	_, err := doneScript.Run(ctx, b.rdb, []string{b.keys.Flushing, b.keys.Meta}, FormatLSN(from), FormatLSN(upto)).Int()
	return chainErr("finish redis flush", err)
}

// Advance moves an empty chain from w to next (after a TRUNCATE barrier
// was committed in PostgreSQL).
func (b *Redis) Advance(ctx context.Context, w, next LSN) error {
	_, err := advanceScript.Run(ctx, b.rdb, []string{b.keys.Buffer, b.keys.Meta}, FormatLSN(w), FormatLSN(next)).Int()
	return chainErr("advance redis chain", err)
}

// Meta reads the meta hash.
func (b *Redis) Meta(ctx context.Context) (Meta, error) {
	vals, err := b.rdb.HMGet(ctx, b.keys.Meta, "lsn", "base", "ffrom", "fupto").Result()
	if err != nil {
		return Meta{}, fmt.Errorf("read redis meta: %w", err)
	}
	var m Meta
	parse := func(v any) (LSN, bool, error) {
		s, ok := v.(string)
		if !ok {
			return 0, false, nil
		}
		l, err := ParseLSN(s)
		return l, true, err
	}
	var ok bool
	if m.LSN, m.Exists, err = parse(vals[0]); err != nil {
		return m, err
	}
	if m.Base, _, err = parse(vals[1]); err != nil {
		return m, err
	}
	if m.From, _, err = parse(vals[2]); err != nil {
		return m, err
	}
	if m.Upto, ok, err = parse(vals[3]); err != nil {
		return m, err
	}
	m.Flushing = ok
	return m, nil
}

// Reset wipes the slot's keys and starts an empty chain at w.
func (b *Redis) Reset(ctx context.Context, w LSN) error {
	_, err := b.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, b.keys.All()...)
		p.HSet(ctx, b.keys.Meta, "lsn", FormatLSN(w), "base", FormatLSN(w))
		return nil
	})
	if err != nil {
		return fmt.Errorf("reset redis buffer: %w", err)
	}
	return nil
}

// Len returns the number of buffered keys (buffer and flushing).
func (b *Redis) Len(ctx context.Context) (int64, error) {
	var a, f *redis.IntCmd
	_, err := b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		a = p.HLen(ctx, b.keys.Buffer)
		f = p.HLen(ctx, b.keys.Flushing)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("count buffered keys: %w", err)
	}
	return a.Val() + f.Val(), nil
}

// Drop deletes the slot's keys (teardown).
func (b *Redis) Drop(ctx context.Context) error {
	if err := b.rdb.Del(ctx, b.keys.All()...).Err(); err != nil {
		return fmt.Errorf("delete redis keys: %w", err)
	}
	return nil
}
