package buffer

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/counter"
)

// peekScript returns one instant of the chain for a fresh read
// (docs/design.md §7): meta's lsn, base, ffrom, fupto, epoch and part,
// the stamps and move counts of the buffer and flushing hashes, and the
// given fields in both hashes. It writes nothing and does O(fields) work.
//
// KEYS: buffer, flushing, meta. ARGV: fields. Reply: 10 values (false for
// a missing one), then the fields' values in buffer, then in flushing.
var peekScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[3], 'lsn', 'base', 'ffrom', 'fupto', 'epoch', 'part')
local out = {}
for i = 1, 6 do out[i] = m[i] or false end
local hb = redis.call('HMGET', KEYS[1], '~', '~n')
local hf = redis.call('HMGET', KEYS[2], '~', '~n')
out[7] = hb[1] or false
out[8] = hb[2] or false
out[9] = hf[1] or false
out[10] = hf[2] or false
if #ARGV > 0 then
  local b = redis.call('HMGET', KEYS[1], unpack(ARGV))
  local f = redis.call('HMGET', KEYS[2], unpack(ARGV))
  for i = 1, #ARGV do out[10 + i] = b[i] or false end
  for i = 1, #ARGV do out[10 + #ARGV + i] = f[i] or false end
end
return out
`)

// Peek is one instant of the chain, read by Peek.
type Peek struct {
	// Exists is false when meta is missing (no chain yet).
	Exists bool
	// LSN is meta.lsn: the buffer and flushing hashes hold exactly the
	// deltas of the transactions up to it (unless Part is set).
	LSN, Base LSN
	// Flushing is true while a flush of (From, Upto] is in progress.
	Flushing   bool
	From, Upto LSN
	Epoch      string
	// Part is set while a batch is written in parts: the buffer then holds
	// deltas past LSN.
	Part string
	// BufferStamp and FlushingStamp are the hashes' stamp fields; the
	// Moves counts their move records.
	BufferStamp, FlushingStamp string
	BufferMoves, FlushingMoves int64
	// Buffered and InFlush are the asked fields' deltas in the buffer and
	// flushing hashes (0 when absent).
	Buffered, InFlush []int64
}

// Start is where the buffer's deltas start: the end of the flush in
// progress, else the chain's base.
func (p Peek) Start() LSN {
	if p.Flushing {
		return p.Upto
	}
	return p.Base
}

// Whole reports whether the instant can be read as the state at LSN: a
// chain exists, no batch is half written, and every hash it needs carries
// the chain's stamp (a lost hash is never read as an empty one, design
// rule 13). It returns the reason when not.
func (p Peek) Whole() (bool, string) {
	switch {
	case !p.Exists:
		return false, "redis holds no buffer chain yet"
	case p.Part != "":
		return false, "a batch is being written to redis in parts"
	case p.LSN != p.Start() && p.BufferStamp != p.Epoch+"/"+FormatLSN(p.Start()):
		return false, "the redis buffer is lost"
	case p.Flushing && p.FlushingStamp != p.Epoch+"/"+FormatLSN(p.From):
		return false, "the redis flushing deltas are lost"
	}
	return true, ""
}

// SameChain reports whether q is the same generation of the chain as p:
// the same epoch, base and flush in progress (LSN may have moved on).
func (p Peek) SameChain(q Peek) bool {
	return p.Exists == q.Exists && p.Epoch == q.Epoch && p.Base == q.Base &&
		p.Flushing == q.Flushing && p.From == q.From && p.Upto == q.Upto
}

// Peek reads one instant of the chain with the deltas of fields, for a
// fresh read. It does not check the instant (see Peek.Whole).
func (b *Redis) Peek(ctx context.Context, fields []string) (Peek, error) {
	args := make([]any, len(fields))
	for i, f := range fields {
		args[i] = f
	}
	res, err := peekScript.Run(ctx, b.rdb, b.keys.All(), args...).Slice()
	if err != nil {
		return Peek{}, fmt.Errorf("read the redis buffer: %w", err)
	}
	if len(res) != 10+2*len(fields) {
		return Peek{}, fmt.Errorf("read the redis buffer: reply of %d values", len(res))
	}
	str := func(i int) (string, bool) {
		s, ok := res[i].(string)
		return s, ok
	}
	lsn := func(i int) (LSN, bool, error) {
		s, ok := str(i)
		if !ok {
			return 0, false, nil
		}
		l, err := ParseLSN(s)
		return l, true, err
	}
	num := func(i int) (int64, error) {
		s, ok := str(i)
		if !ok {
			return 0, nil
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read the redis buffer: %q: %w", s, err)
		}
		return n, nil
	}
	var p Peek
	if p.LSN, p.Exists, err = lsn(0); err != nil {
		return Peek{}, err
	}
	if p.Base, _, err = lsn(1); err != nil {
		return Peek{}, err
	}
	if p.From, _, err = lsn(2); err != nil {
		return Peek{}, err
	}
	if p.Upto, p.Flushing, err = lsn(3); err != nil {
		return Peek{}, err
	}
	p.Epoch, _ = str(4)
	p.Part, _ = str(5)
	p.BufferStamp, _ = str(6)
	p.FlushingStamp, _ = str(8)
	if p.BufferMoves, err = num(7); err != nil {
		return Peek{}, err
	}
	if p.FlushingMoves, err = num(9); err != nil {
		return Peek{}, err
	}
	p.Buffered, p.InFlush = make([]int64, len(fields)), make([]int64, len(fields))
	for i := range fields {
		if p.Buffered[i], err = num(10 + i); err != nil {
			return Peek{}, err
		}
		if p.InFlush[i], err = num(10 + len(fields) + i); err != nil {
			return Peek{}, err
		}
	}
	return p, nil
}

// MoveList is the lifecycle moves recorded in one hash, in stream order,
// each with the LSN of the batch that recorded it.
type MoveList []LSNMove

// LSNMove is a move and the end LSN of its batch.
type LSNMove struct {
	LSN  LSN
	Move counter.Move
}

// Moves collects the move records of the buffer (flushing == false) or
// flushing hash with HSCAN, outside any script, so that Redis is never
// busy for the whole hash at once. The buffer may change meanwhile: the
// caller compares the count with a later Peek's (records are only ever
// added while the chain's generation holds).
func (b *Redis) Moves(ctx context.Context, flushing bool) (MoveList, int, error) {
	key := b.keys.Buffer
	if flushing {
		key = b.keys.Flushing
	}
	recs := map[string]string{}
	var cursor uint64
	for {
		kv, next, err := b.rdb.HScan(ctx, key, cursor, MovesField+"*", DefaultScanPage).Result()
		if err != nil {
			return nil, 0, fmt.Errorf("read the redis moves: %w", err)
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if strings.HasPrefix(kv[i], MovesField) {
				recs[kv[i]] = kv[i+1]
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	names := make([]string, 0, len(recs))
	for f := range recs {
		names = append(names, f)
	}
	slices.Sort(names)
	var out MoveList
	for _, f := range names {
		at, err := ParseLSN(strings.TrimPrefix(f, MovesField))
		if err != nil {
			return nil, 0, err
		}
		var pairs []string
		if err := json.Unmarshal([]byte(recs[f]), &pairs); err != nil || len(pairs)%2 != 0 {
			return nil, 0, fmt.Errorf("read the redis moves: %q: malformed %q", f, recs[f])
		}
		for j := 0; j < len(pairs); j += 2 {
			out = append(out, LSNMove{LSN: at, Move: counter.Move{Field: pairs[j], To: pairs[j+1]}})
		}
	}
	return out, len(names), nil
}
