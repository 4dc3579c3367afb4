package buffer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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

// StampField is the field of the buffer and flushing hashes that names
// the chain they belong to: "<epoch>/<base>", the random epoch of the last
// Reset and the LSN the hash's deltas start after. A hash that should
// exist but has no stamp, or another one, was lost (deleted, evicted, or
// left behind by a failover to a replica that lacks the last writes): the
// chain is broken, never read as empty (design rule 13). Counter names
// cannot start with '~', so no delta field collides with it.
const StampField = "~"

// MovesField prefixes the fields of the buffer and flushing hashes that
// record the lifecycle moves of one Apply: "~m<last>", last being the
// batch's last LSN in FormatLSN form, so that the fields sort in stream
// order.
const MovesField = "~m"

// MovesCountField counts the MovesField fields of a hash, for Len.
const MovesCountField = "~n"

// applyScript adds a batch of deltas and moves meta.lsn from prev to last,
// atomically. A batch at or below meta.lsn was already applied and is
// ignored (a replay); a batch that does not start at meta.lsn would leave
// a hole and is refused. Rows never share a batch boundary, so this
// compares whole transactions, never rows (design rule 5).
//
// Before the batch's deltas, the script runs its directives on what the
// buffer holds: a pair (field, "") drops the field, a pair (field, other)
// moves the field's delta to other. The aggregator uses them for a target
// row that was deleted or changed its key (design rule 17). The script
// also records them, in order, in the field MovesField+last (a JSON array
// of field, to pairs), so that the flush that hands the buffer over runs
// them on the deltas it carried from earlier flushes (design rule 2).
//
// A batch of more than MaxApplyFields deltas is written in parts, one
// script call each, so that no call keeps Redis busy for long: part k of
// the batch ending at last sets meta.part to "<last>/<k>", the moves go
// with part 1, and only the final part moves meta.lsn (and clears
// meta.part). A part already applied (a call retried) is ignored; a part
// out of sequence is a broken chain. While meta.part is set the buffer
// holds part of a batch, so no hand-over takes it (handOverScript), and a
// session that starts with meta.part set resets the buffer: a write in
// parts that was interrupted cannot be finished.
//
// The parts of one source transaction too big to hold in memory until
// its COMMIT are written before it (Spill), tagged with the transaction's
// place (its commit record's start + 1, which lies past meta.lsn and at or
// below its end) instead of its end, which is not known yet: part k is
// then "<k>/<tag>" and meta.part "<tag>/<k>", and the last, at the COMMIT
// (ApplyAfter), carries the transaction's end LSN and the moves.
//
// KEYS: buffer, meta. ARGV: prev, last, part (0 for a batch in one call;
// k or k/tag), final (1 for the last part, or a batch in one call), n, n
// directive pairs, then field/delta pairs.
var applyScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[2], 'lsn', 'base', 'epoch', 'fupto', 'part')
if not m[1] then return redis.error_reply('WALCOUNT_CHAIN no meta') end
if m[1] >= ARGV[2] then return 0 end
if m[1] ~= ARGV[1] then return redis.error_reply('WALCOUNT_CHAIN meta.lsn ' .. m[1] .. ' is not ' .. ARGV[1]) end
local pk, tag = string.match(ARGV[3], '^(%d+)/?(.*)$')
local part = tonumber(pk)
if tag == '' then tag = ARGV[2] end
if part == 0 then
  if m[5] then return redis.error_reply('WALCOUNT_CHAIN a write in parts (' .. m[5] .. ') was interrupted') end
else
  local cur = m[5] or nil
  if cur == tag .. '/' .. pk then return 0 end
  local want = nil
  if part > 1 then want = tag .. '/' .. tostring(part - 1) end
  if cur ~= want then
    return redis.error_reply('WALCOUNT_CHAIN part ' .. pk .. ' of the batch ' .. tag .. ' follows ' .. tostring(m[5]))
  end
end
-- While a flush is in progress the buffer starts where the flush ends.
local start = m[4] or m[2]
local stamp = (m[3] or '') .. '/' .. start
if m[1] ~= start then
  local have = redis.call('HGET', KEYS[1], '~')
  if have ~= stamp then
    return redis.error_reply('WALCOUNT_CHAIN the buffer of ' .. start .. '..' .. m[1] .. ' is lost (stamp ' .. tostring(have) .. ')')
  end
end
local i = 6
local nmoves = tonumber(ARGV[5])
if nmoves > 0 then
  local mv = {}
  for d = 0, nmoves - 1 do
    mv[#mv+1] = ARGV[6+2*d]
    mv[#mv+1] = ARGV[7+2*d]
  end
  if redis.call('HEXISTS', KEYS[1], '~m' .. ARGV[2]) == 0 then
    redis.call('HINCRBY', KEYS[1], '~n', 1)
  end
  redis.call('HSET', KEYS[1], '~m' .. ARGV[2], cjson.encode(mv))
end
for d = 1, nmoves do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  if v then
    redis.call('HDEL', KEYS[1], ARGV[i])
    if ARGV[i+1] ~= '' and redis.call('HINCRBY', KEYS[1], ARGV[i+1], v) == 0 then
      redis.call('HDEL', KEYS[1], ARGV[i+1])
    end
  end
  i = i + 2
end
for j = i, #ARGV, 2 do
  if redis.call('HINCRBY', KEYS[1], ARGV[j], ARGV[j+1]) == 0 then
    redis.call('HDEL', KEYS[1], ARGV[j])
  end
end
redis.call('HSET', KEYS[1], '~', stamp)
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[2], 'lsn', ARGV[2])
  if part > 0 then redis.call('HDEL', KEYS[2], 'part') end
else
  redis.call('HSET', KEYS[2], 'part', tag .. '/' .. pk)
end
return 1
`)

// MaxApplyFields is the most deltas one Apply script call adds: a bigger
// batch (one transaction that touches a million keys) is written in
// parts of this size.
const MaxApplyFields = 5000

// handOverScript starts or resumes a flush and returns its range and the
// size of its hash; the deltas themselves are read afterwards in pages
// (Scan), so that no script and no reply grows with the batch (design
// rule 6). The flushing hash never changes once it is made, and its stamp
// is checked here and again after the pages were read, so a lost hash can
// never be read as an empty one (design rule 13). With a flush in progress
// it returns that flush if it starts at W; if it ends at or below W it was
// already committed and is cleaned up first (UNLINK: freed off Redis's
// main thread). Else it renames buffer to flushing and records the range
// (W, lsn]. It returns an empty list when there is nothing past W.
//
// KEYS: buffer, flushing, meta. ARGV: W. Reply: from, upto, the number of
// fields of flushing (HLEN), the number of its delta fields.
var handOverScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[3], 'lsn', 'base', 'ffrom', 'fupto', 'epoch', 'part')
if not m[1] then return redis.error_reply('WALCOUNT_CHAIN no meta') end
local epoch = m[5] or ''
local function batch(from, upto)
  if redis.call('HGET', KEYS[2], '~') ~= epoch .. '/' .. from then
    return redis.error_reply('WALCOUNT_CHAIN the flushing deltas of ' .. from .. '..' .. upto .. ' are lost')
  end
  local n = redis.call('HLEN', KEYS[2])
  local moves = tonumber(redis.call('HGET', KEYS[2], '~n') or '0')
  if moves > 0 then moves = moves + 1 end
  return {from, upto, tostring(n), tostring(n - 1 - moves)}
end
if m[4] then
  if m[3] == ARGV[1] then return batch(m[3], m[4]) end
  if m[4] <= ARGV[1] then
    redis.call('UNLINK', KEYS[2])
    redis.call('HDEL', KEYS[3], 'ffrom', 'fupto')
    redis.call('HSET', KEYS[3], 'base', m[4])
    m[2] = m[4]
  else
    return redis.error_reply('WALCOUNT_CHAIN flushing starts at ' .. m[3] .. ', checkpoint is ' .. ARGV[1])
  end
end
if m[2] ~= ARGV[1] then return redis.error_reply('WALCOUNT_CHAIN buffer starts at ' .. tostring(m[2]) .. ', checkpoint is ' .. ARGV[1]) end
if m[1] == ARGV[1] then return {} end
-- A batch written in parts is not whole yet: the next flush takes it.
if m[6] then return {} end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('WALCOUNT_CHAIN the buffer of ' .. m[2] .. '..' .. m[1] .. ' is lost')
end
redis.call('RENAME', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[3], 'ffrom', ARGV[1], 'fupto', m[1])
return batch(ARGV[1], m[1])
`)

// scannedScript checks, after the pages of a flush were read, that the
// flushing hash is still the one handed over: the same range in meta, the
// same stamp and the same number of fields. With the caller's count of
// the distinct fields it read, this proves that the pages held the whole
// hash (a failover or an eviction in between fails it).
//
// KEYS: flushing, meta. ARGV: from, upto, HLEN.
var scannedScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[2], 'ffrom', 'fupto', 'epoch')
if m[1] ~= ARGV[1] or m[2] ~= ARGV[2] then
  return redis.error_reply('WALCOUNT_CHAIN the flush of ' .. ARGV[1] .. '..' .. ARGV[2] .. ' changed while its deltas were read')
end
if redis.call('HGET', KEYS[1], '~') ~= (m[3] or '') .. '/' .. ARGV[1] or redis.call('HLEN', KEYS[1]) ~= tonumber(ARGV[3]) then
  return redis.error_reply('WALCOUNT_CHAIN the flushing deltas of ' .. ARGV[1] .. '..' .. ARGV[2] .. ' were lost while they were read')
end
return 1
`)

// doneScript ends a flush after its PostgreSQL commit: the flushing hash
// goes and the buffer chain now starts at fupto.
var doneScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[2], 'ffrom', 'fupto')
if m[1] ~= ARGV[1] or m[2] ~= ARGV[2] then return 0 end
redis.call('UNLINK', KEYS[1])
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

// lenScript counts the buffered deltas, stamps and move records (and
// their count, field "~n") left out.
var lenScript = redis.NewScript(`
local n = 0
for _, k in ipairs(KEYS) do
  local m = tonumber(redis.call('HGET', k, '~n') or '0')
  if m > 0 then m = m + 1 end
  n = n + redis.call('HLEN', k) - redis.call('HEXISTS', k, '~') - m
end
return n
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
	// History names the server history the chain was written against
	// (see Reset); empty for a chain of an older walcount.
	History string
	// IdleFrom and IdleTo record that walcount confirmed the slot past W
	// = IdleFrom, up to IdleTo, with nothing in between for it (see
	// RecordIdleConfirm); zero when it did not.
	IdleFrom, IdleTo LSN
	// Part is set while a batch is written in parts ("<last>/<k>", see
	// Apply); a session that starts with it set resets the buffer.
	Part string
}

// Batch is a flush handed over: the deltas of the transactions in
// (From, Upto], field → delta, and the lifecycle moves of those
// transactions in stream order (already run on Deltas; the flusher runs
// them on what it carried from earlier flushes).
type Batch struct {
	From, Upto LSN
	Deltas     map[string]int64
	Moves      []counter.Move
}

// Redis is walcount's buffer for one slot, kept in Redis. It is safe for
// concurrent use; the protocol itself assumes one walcount per slot.
type Redis struct {
	rdb  redis.UniversalClient
	slot string
	keys Keys
}

// New returns the buffer of slot on rdb: a single node, a Cluster or a
// Sentinel-watched primary, through go-redis's UniversalClient.
func New(rdb redis.UniversalClient, slot string) *Redis {
	return &Redis{rdb: rdb, slot: slot, keys: KeysFor(slot)}
}

// Ping checks that the Redis node holding the slot's keys answers. On a
// Cluster a PING goes to any node; this reads the meta key, so it asks the
// node that matters.
func (b *Redis) Ping(ctx context.Context) error {
	return b.rdb.Exists(ctx, b.keys.Meta).Err()
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

// Apply runs the moves on the buffered deltas, adds the deltas for
// the transactions in (prev, last] and moves meta.lsn to last, in one
// script. It reports false when the batch was already applied, and fails
// with ErrChainBroken when the chain does not continue at prev or a key it
// needs was lost.
//
// A batch of more than MaxApplyFields deltas is written in parts, one
// script call each (see applyScript).
func (b *Redis) Apply(ctx context.Context, prev, last LSN, moves []counter.Move, deltas []counter.Delta) (bool, error) {
	applied, _, err := b.applyParts(ctx, prev, last, "", 0, true, moves, deltas)
	return applied, err
}

// Spill writes deltas of a source transaction that has not committed yet,
// whose commit record starts at tag-1, as parts done+1, done+2, … of its
// write in parts, and returns the parts written so far. The chain stays
// at prev, and meta.part says a write in parts is under way, so no
// hand-over takes the buffer and a session that starts with it set
// discards the buffer and replays from W: an interrupted transaction
// leaves nothing.
func (b *Redis) Spill(ctx context.Context, prev, tag LSN, done int, deltas []counter.Delta) (int, error) {
	_, parts, err := b.applyParts(ctx, prev, tag, FormatLSN(tag), done, false, nil, deltas)
	return done + parts, err
}

// ApplyAfter ends a write in parts Spill began: at the transaction's
// COMMIT, it runs the moves and adds the remaining deltas as the parts
// after done, and the last moves meta.lsn to last.
func (b *Redis) ApplyAfter(ctx context.Context, prev, last, tag LSN, done int, moves []counter.Move, deltas []counter.Delta) (bool, error) {
	applied, _, err := b.applyParts(ctx, prev, last, FormatLSN(tag), done, true, moves, deltas)
	return applied, err
}

// applyParts writes deltas in calls of at most MaxApplyFields, numbered
// after done, the moves with the first; final moves meta.lsn to last with
// the last call. tag names the parts ("" for last). It returns the calls
// made.
func (b *Redis) applyParts(ctx context.Context, prev, last LSN, tag string, done int, final bool, moves []counter.Move, deltas []counter.Delta) (bool, int, error) {
	nonzero := 0
	for _, d := range deltas {
		if d.N != 0 {
			nonzero++
		}
	}
	parts := max(1, (nonzero+MaxApplyFields-1)/MaxApplyFields)
	applied := false
	next := 0
	for part := 1; part <= parts; part++ {
		args := make([]any, 0, 5+2*len(moves)+2*min(nonzero, MaxApplyFields))
		var k any = done + part
		if tag != "" {
			k = strconv.Itoa(done+part) + "/" + tag
		} else if parts == 1 && done == 0 && final {
			k = 0
		}
		fin := "0"
		if final && part == parts {
			fin = "1"
		}
		args = append(args, FormatLSN(prev), FormatLSN(last), k, fin)
		if part == 1 {
			args = append(args, len(moves))
			for _, m := range moves {
				args = append(args, m.Field, m.To)
			}
		} else {
			args = append(args, 0)
		}
		for n := 0; next < len(deltas) && n < MaxApplyFields; next++ {
			if d := deltas[next]; d.N != 0 {
				args = append(args, d.Field, d.N)
				n++
			}
		}
		n, err := applyScript.Run(ctx, b.rdb, []string{b.keys.Buffer, b.keys.Meta}, args...).Int()
		if err != nil {
			return false, part - 1, chainErr("apply deltas to redis", err)
		}
		applied = applied || n == 1
	}
	return applied, parts, nil
}

// Handed is a flush handed over, before its deltas are read: the range
// (From, Upto] and the size of its hash.
type Handed struct {
	From, Upto LSN
	// Fields is the hash's HLEN, Deltas the number of its delta fields
	// (stamp and move records left out).
	Fields, Deltas int64
}

// DefaultScanPage is how many fields one HSCAN of the flushing hash asks
// for.
const DefaultScanPage = 2000

// Begin starts or resumes a flush from w and returns its range and size
// without its deltas, or ok == false when nothing lies past w. Its script
// does a constant amount of work whatever the batch size; Scan reads the
// deltas.
func (b *Redis) Begin(ctx context.Context, w LSN) (h Handed, ok bool, err error) {
	res, err := handOverScript.Run(ctx, b.rdb, b.keys.All(), FormatLSN(w)).StringSlice()
	if err != nil {
		return Handed{}, false, chainErr("hand over redis buffer", err)
	}
	if len(res) == 0 {
		return Handed{}, false, nil
	}
	if len(res) != 4 {
		return Handed{}, false, fmt.Errorf("hand over redis buffer: reply of %d values", len(res))
	}
	if h.From, err = ParseLSN(res[0]); err != nil {
		return Handed{}, false, err
	}
	if h.Upto, err = ParseLSN(res[1]); err != nil {
		return Handed{}, false, err
	}
	if h.Fields, err = strconv.ParseInt(res[2], 10, 64); err != nil {
		return Handed{}, false, fmt.Errorf("hand over redis buffer: %w", err)
	}
	if h.Deltas, err = strconv.ParseInt(res[3], 10, 64); err != nil {
		return Handed{}, false, fmt.Errorf("hand over redis buffer: %w", err)
	}
	return h, true, nil
}

// Scan reads the deltas of the flush h in pages of about page fields
// (HSCAN; DefaultScanPage when page ≤ 0) and calls fn with each page's
// deltas. The flushing hash does not change during a flush, but HSCAN may
// return a field twice: fn must treat a field it has seen as the same
// delta again, not as another one. Scan returns the flush's lifecycle
// moves in stream order. After the last page it checks that the hash is
// still the one handed over; the caller must check that it saw h.Deltas
// distinct fields.
func (b *Redis) Scan(ctx context.Context, h Handed, page int, fn func(fields []string, deltas []int64) error) ([]counter.Move, error) {
	if page <= 0 {
		page = DefaultScanPage
	}
	moveLists := map[string]string{}
	var cursor uint64
	for {
		kv, next, err := b.rdb.HScan(ctx, b.keys.Flushing, cursor, "", int64(page)).Result()
		if err != nil {
			return nil, fmt.Errorf("read the flushing deltas: %w", err)
		}
		fields, deltas := make([]string, 0, len(kv)/2), make([]int64, 0, len(kv)/2)
		for i := 0; i+1 < len(kv); i += 2 {
			switch {
			case kv[i] == StampField || kv[i] == MovesCountField:
				continue
			case strings.HasPrefix(kv[i], MovesField):
				moveLists[kv[i]] = kv[i+1]
				continue
			}
			n, err := strconv.ParseInt(kv[i+1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("read the flushing deltas: field %q: %w", kv[i], err)
			}
			fields, deltas = append(fields, kv[i]), append(deltas, n)
		}
		if len(fields) > 0 {
			if err := fn(fields, deltas); err != nil {
				return nil, err
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	err := scannedScript.Run(ctx, b.rdb, []string{b.keys.Flushing, b.keys.Meta}, FormatLSN(h.From), FormatLSN(h.Upto), h.Fields).Err()
	if err != nil {
		return nil, chainErr("read the flushing deltas", err)
	}
	moveFields := make([]string, 0, len(moveLists))
	for f := range moveLists {
		moveFields = append(moveFields, f)
	}
	slices.Sort(moveFields)
	var moves []counter.Move
	for _, f := range moveFields {
		var pairs []string
		if err := json.Unmarshal([]byte(moveLists[f]), &pairs); err != nil || len(pairs)%2 != 0 {
			return nil, fmt.Errorf("hand over redis buffer: moves %q: malformed %q", f, moveLists[f])
		}
		for j := 0; j < len(pairs); j += 2 {
			moves = append(moves, counter.Move{Field: pairs[j], To: pairs[j+1]})
		}
	}
	return moves, nil
}

// HandOver starts or resumes a flush from w and returns it with all its
// deltas (Begin, then Scan into memory), or ok == false when nothing lies
// past w.
func (b *Redis) HandOver(ctx context.Context, w LSN) (batch Batch, ok bool, err error) {
	h, ok, err := b.Begin(ctx, w)
	if err != nil || !ok {
		return Batch{}, ok, err
	}
	batch = Batch{From: h.From, Upto: h.Upto, Deltas: make(map[string]int64, h.Deltas)}
	batch.Moves, err = b.Scan(ctx, h, 0, func(fields []string, deltas []int64) error {
		for i, f := range fields {
			batch.Deltas[f] = deltas[i]
		}
		return nil
	})
	if err != nil {
		return Batch{}, false, err
	}
	if int64(len(batch.Deltas)) != h.Deltas {
		return Batch{}, false, fmt.Errorf("hand over redis buffer: %w: read %d of %d flushing deltas", ErrChainBroken, len(batch.Deltas), h.Deltas)
	}
	return batch, true, nil
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
	vals, err := b.rdb.HMGet(ctx, b.keys.Meta, "lsn", "base", "ffrom", "fupto", "hist", "idle", "part").Result()
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
	m.History, _ = vals[4].(string)
	m.Part, _ = vals[6].(string)
	if idle, ok := vals[5].(string); ok {
		from, to, _ := strings.Cut(idle, "/")
		if m.IdleFrom, err = ParseLSN(from); err != nil {
			return m, err
		}
		if m.IdleTo, err = ParseLSN(to); err != nil {
			return m, err
		}
	}
	return m, nil
}

// RecordIdleConfirm records that the slot is about to be confirmed past W
// up to to, with nothing in between for walcount, so that the next start
// does not take the slot's position past W for changes that were skipped.
// Losing the record costs a reconciliation, never a count.
func (b *Redis) RecordIdleConfirm(ctx context.Context, w, to LSN) error {
	if err := b.rdb.HSet(ctx, b.keys.Meta, "idle", FormatLSN(w)+"/"+FormatLSN(to)).Err(); err != nil {
		return fmt.Errorf("record an idle confirmation: %w", err)
	}
	return nil
}

// Reset wipes the slot's keys and starts an empty chain at w, written
// against history (the server's system identifier and timeline, which a
// later session compares). Each reset draws a new epoch, so a hash left
// over from an earlier chain can never pass for part of this one.
func (b *Redis) Reset(ctx context.Context, w LSN, history string) error {
	var e [8]byte
	_, _ = rand.Read(e[:]) // crypto/rand.Read never fails
	_, err := b.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Unlink(ctx, b.keys.All()...)
		p.HSet(ctx, b.keys.Meta, "lsn", FormatLSN(w), "base", FormatLSN(w), "epoch", hex.EncodeToString(e[:]), "hist", history)
		return nil
	})
	if err != nil {
		return fmt.Errorf("reset redis buffer: %w", err)
	}
	return nil
}

// Len returns the number of buffered keys (buffer and flushing).
func (b *Redis) Len(ctx context.Context) (int64, error) {
	n, err := lenScript.Run(ctx, b.rdb, []string{b.keys.Buffer, b.keys.Flushing}).Int64()
	if err != nil {
		return 0, fmt.Errorf("count buffered keys: %w", err)
	}
	return n, nil
}

// Drop deletes the slot's keys (teardown).
func (b *Redis) Drop(ctx context.Context) error {
	if err := b.rdb.Del(ctx, b.keys.All()...).Err(); err != nil {
		return fmt.Errorf("delete redis keys: %w", err)
	}
	return nil
}
