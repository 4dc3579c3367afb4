package fresh

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/metrics"
)

// LSN is a PostgreSQL WAL position.
type LSN = buffer.LSN

// MaxKeys is the most keys one read may ask for.
const MaxKeys = 1000

var (
	// ErrUnknownCounter is a read of a counter that is not configured.
	ErrUnknownCounter = errors.New("no such counter")
	// ErrBadKey is a key the counter's target key cannot hold.
	ErrBadKey = errors.New("bad key")
	// ErrNotExact is a read of a counter kind whose value a fresh read
	// cannot give exactly at one LSN yet (docs/design.md §7 (f)): a
	// counter through a parent (and its via table's), a multi-level
	// counter (one that sums another counter's column) and a max or min.
	// The read is refused rather than answered with a value that may
	// include changes past its LSN.
	ErrNotExact = errors.New("not exact yet")
	// ErrNotNow is a read that found no whole instant of the chain before
	// its deadline (a batch written in parts, a chain being reset).
	ErrNotNow = errors.New("no consistent state to read yet")
)

// belowMin is readOnce's reason when the chain has not reached min yet.
const belowMin = "below min_lsn"

// NotReachedError is a read whose min_lsn the chain did not reach before
// the read's deadline.
type NotReachedError struct {
	Min, Reached LSN
}

func (e *NotReachedError) Error() string {
	return fmt.Sprintf("walcount has not read through %s yet: it reached %s", e.Min, e.Reached)
}

// Options configure a Reader.
type Options struct {
	// Pool is the reads' own pool: reads never take a connection the
	// stream or the flush needs.
	Pool     *pgxpool.Pool
	Buffer   *buffer.Redis
	Slot     string
	Counters []counter.Counter
	// Emit writes a transaction to the WAL (a heartbeat) and returns its
	// LSN, so that a wait for an LSN ends on a quiet database; nil: none.
	Emit func(ctx context.Context) (LSN, error)
	// Received returns the stream's received position (0 when this
	// process does not stream): a read waiting for an LSN the stream has
	// received already waits for the aggregator's hand-over to Redis, and
	// a heartbeat would not make that sooner. Nil: unknown.
	Received func() LSN
	Metrics  *metrics.Metrics
	Logger   *zap.Logger
}

// Reader answers fresh reads (docs/design.md §7). Safe for concurrent use.
type Reader struct {
	opt      Options
	log      *zap.Logger
	counters map[string]counter.Counter

	// inexact names the counters fresh reads refuse, with their kind.
	inexact map[string]string

	mu       sync.Mutex
	resolved map[string]*counter.Resolved

	w *watcher
}

// New returns a Reader; it connects nothing yet.
func New(opt Options) *Reader {
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	if opt.Metrics == nil {
		opt.Metrics = metrics.New()
	}
	r := &Reader{opt: opt, log: opt.Logger, counters: map[string]counter.Counter{}, inexact: map[string]string{},
		resolved: map[string]*counter.Resolved{}}
	for _, c := range opt.Counters {
		r.counters[c.Name] = c
		if kind := InexactKind(c, opt.Counters); kind != "" {
			r.inexact[c.Name] = kind
		}
	}
	r.w = newWatcher(opt.Buffer, opt.Emit, opt.Received, opt.Logger, opt.Metrics)
	return r
}

// Value is one key's fresh value. Numbers are decimal text in the
// column's scale (an extremum's: its column's text form).
type Value struct {
	Key string
	// Found is false for a key with no target row and nothing pending.
	Found bool
	// Value is the column plus every pending delta; Column is empty when
	// no target row has the key.
	Value, Column string
	// Pending is the deltas not in the column, in the column's scale (an
	// extremum's: the recomputes to come).
	Pending string
	// Dirty is true while the key (or its whole counter) is marked dirty
	// (design rule 14): walcount does not vouch for it until a
	// reconciliation repaired it.
	Dirty bool
}

// Snapshot is the values of some keys at one LSN.
type Snapshot struct {
	LSN    LSN
	Values []Value
}

// InexactKind returns the kind of c when a fresh read of it is not exact
// at its LSN (docs/design.md §7 (f)), "" for the kinds that are: counts,
// filtered counts, sums and totals with no key. Change events (package
// events) leave out the same counters.
func InexactKind(c counter.Counter, all []counter.Counter) string {
	if _, fn := c.Extremum(); fn != "" {
		// Its value is recomputed from the source rows of the read's
		// snapshot, which may hold transactions past the LSN.
		return fn
	}
	if c.Through != nil {
		// The level above a via table, or one of the via table's own:
		// the via table trails the source by its pending deltas.
		return "via"
	}
	for _, b := range all {
		if counter.Feeds(b, c) {
			// It sums a lower counter's column, which trails the
			// source by that counter's pending deltas.
			return "multi-level"
		}
	}
	return ""
}

// NotExactError is a read of a counter whose kind fresh reads do not
// answer exactly yet; it wraps ErrNotExact.
type NotExactError struct {
	Counter, Kind string
}

func (e *NotExactError) Error() string {
	return fmt.Sprintf("fresh reads of %s counters are not exact yet; read the column (counter %s)", e.Kind, e.Counter)
}

func (e *NotExactError) Unwrap() error { return ErrNotExact }

func (r *Reader) resolve(ctx context.Context, name string) (*counter.Resolved, error) {
	c, ok := r.counters[name]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownCounter, name)
	}
	if kind := r.inexact[name]; kind != "" {
		return nil, &NotExactError{Counter: name, Kind: kind}
	}
	r.mu.Lock()
	res := r.resolved[name]
	r.mu.Unlock()
	if res != nil {
		return res, nil
	}
	res, err := counter.Resolve(ctx, r.opt.Pool, c)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.resolved[name] = res
	r.mu.Unlock()
	return res, nil
}

// forget drops a counter's statements after a failed read, so that the
// next read resolves the counter again (a table altered meanwhile).
func (r *Reader) forget(name string) {
	r.mu.Lock()
	delete(r.resolved, name)
	r.mu.Unlock()
}

// canonical returns key as the stream and the buffer write it: integer
// keys without sign or leading zeros (the form pgoutput sends); other
// types as given.
func canonical(res *counter.Resolved, key string) (string, error) {
	if res.Counter.Keyless() {
		return key, nil
	}
	if res.IntKey {
		n, err := strconv.ParseInt(strings.TrimSpace(key), 10, 64)
		if err != nil {
			return "", fmt.Errorf("%w %q: the target key is an integer", ErrBadKey, key)
		}
		return strconv.FormatInt(n, 10), nil
	}
	return key, nil
}

// WaitFor waits until the chain in Redis reaches at least min (see
// watcher) and returns the LSN reached; on ctx's end it returns the last
// LSN seen with ctx's error.
func (r *Reader) WaitFor(ctx context.Context, min LSN) (LSN, error) {
	return r.w.waitFor(ctx, min)
}

// Read returns the values of keys of the counter name at one LSN, at
// least min (0: any), exact at that LSN whatever is buffered, carried,
// staged or being flushed (docs/design.md §7). It tries again until ctx
// ends while the chain is not readable.
func (r *Reader) Read(ctx context.Context, name string, keys []string, min LSN) (Snapshot, error) {
	res, err := r.resolve(ctx, name)
	if err != nil {
		return Snapshot{}, err
	}
	canon := make([]string, len(keys))
	for i, k := range keys {
		if canon[i], err = canonical(res, k); err != nil {
			return Snapshot{}, err
		}
	}
	why := "no attempt"
	for attempt := 0; ; attempt++ {
		snap, retry, err := r.readOnce(ctx, res, canon, min)
		if err != nil {
			if ctx.Err() == nil {
				r.forget(name)
			}
			return Snapshot{}, err
		}
		if retry == "" {
			for i := range snap.Values {
				snap.Values[i].Key = keys[i]
			}
			return snap, nil
		}
		if retry == belowMin {
			// Wait for the chain to reach min, then read.
			r.opt.Metrics.FreshReadWaits.Inc()
			start := time.Now()
			reached, err := r.w.waitFor(ctx, min)
			r.opt.Metrics.FreshReadWaitSeconds.Observe(time.Since(start).Seconds())
			if err != nil {
				return Snapshot{}, &NotReachedError{Min: min, Reached: reached}
			}
			continue
		}
		why = retry
		r.opt.Metrics.FreshReadRetries.Inc()
		// Back off a little: the states that need another attempt (a
		// write in parts, a flush committing) last milliseconds.
		d := time.Duration(min64(int64(attempt+1), 20)) * time.Millisecond
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return Snapshot{}, fmt.Errorf("%w: %s", ErrNotNow, why)
		case <-t.C:
		}
	}
}

func min64(a, b int64) int64 {
	if a < b {
		return a
	}
	return b
}

// row is what the Read statement returns for one key.
type row struct {
	w       string
	present bool
	column  *string
	carried int64
	dirty   bool
	now     *string
}

// readOnce makes one attempt: it returns the snapshot, or the reason to
// try again.
func (r *Reader) readOnce(ctx context.Context, res *counter.Resolved, keys []string, min LSN) (Snapshot, string, error) {
	name := res.Counter.Name
	fields := make([]string, len(keys))
	for i, k := range keys {
		fields[i] = counter.Field(name, k)
	}
	// (a) one instant of the chain.
	p, err := r.opt.Buffer.Peek(ctx, fields)
	if err != nil {
		return Snapshot{}, "", err
	}
	if ok, why := p.Whole(); !ok {
		return Snapshot{}, why, nil
	}
	if p.LSN < min {
		return Snapshot{}, belowMin, nil
	}
	// (e) lifecycle moves, when a hash that may count holds some.
	var bufMoves, flushMoves buffer.MoveList
	all := fields
	if (p.BufferMoves > 0 && p.LSN != p.Start()) || (p.Flushing && p.FlushingMoves > 0) {
		var nb, nf int
		if p.BufferMoves > 0 {
			if bufMoves, nb, err = r.opt.Buffer.Moves(ctx, false); err != nil {
				return Snapshot{}, "", err
			}
		}
		if p.Flushing && p.FlushingMoves > 0 {
			if flushMoves, nf, err = r.opt.Buffer.Moves(ctx, true); err != nil {
				return Snapshot{}, "", err
			}
		}
		all = withMoveFields(fields, name, bufMoves, flushMoves)
		q, err := r.opt.Buffer.Peek(ctx, all)
		if err != nil {
			return Snapshot{}, "", err
		}
		if ok, why := q.Whole(); !ok {
			return Snapshot{}, why, nil
		}
		if !p.SameChain(q) || q.BufferMoves != int64(nb) || (q.Flushing && q.FlushingMoves != int64(nf)) {
			return Snapshot{}, "the buffer changed while its moves were read", nil
		}
		p = q
	}
	// (c) one PostgreSQL snapshot.
	allKeys := make([]string, len(all))
	for i, f := range all {
		_, allKeys[i], _ = counter.SplitField(f)
	}
	rows, err := r.query(ctx, res, allKeys)
	if err != nil {
		return Snapshot{}, "", err
	}
	w, err := parsePGLSN(rows[0].w)
	if err != nil {
		return Snapshot{}, "", err
	}
	// (d) what the snapshot's W says counts.
	withFlush := false
	switch {
	case p.Flushing && w == p.From:
		withFlush = true
	case p.Flushing && w == p.Upto:
	case !p.Flushing && w == p.Base:
	default:
		return Snapshot{}, fmt.Sprintf("the checkpoint %s is not where the redis chain starts", w), nil
	}
	pending := make(map[string]int64, len(all))
	for i, f := range all {
		if rows[i].carried != 0 {
			pending[f] = rows[i].carried
		}
	}
	if withFlush {
		runMoves(pending, flushMoves, 0)
		for i, f := range all {
			pending[f] += p.InFlush[i]
		}
	}
	runMoves(pending, bufMoves, p.LSN)
	for i, f := range all {
		pending[f] += p.Buffered[i]
	}
	snap := Snapshot{LSN: p.LSN, Values: make([]Value, len(fields))}
	for i, f := range fields {
		snap.Values[i] = value(res, rows[i], pending[f])
	}
	return snap, "", nil
}

// withMoveFields adds to fields every field of the counter the moves name.
func withMoveFields(fields []string, name string, lists ...buffer.MoveList) []string {
	seen := make(map[string]bool, len(fields))
	out := append([]string(nil), fields...)
	for _, f := range fields {
		seen[f] = true
	}
	add := func(f string) {
		if c, _, ok := counter.SplitField(f); ok && c == name && !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	for _, l := range lists {
		for _, m := range l {
			add(m.Move.Field)
			if m.Move.To != "" {
				add(m.Move.To)
			}
		}
	}
	return out
}

// runMoves runs lifecycle moves on deltas as the flush runs them on its
// carried deltas: a dropped field's delta goes, a moved one's joins its
// new field. Moves of batches past upto (when not 0) are left out.
func runMoves(deltas map[string]int64, moves buffer.MoveList, upto LSN) {
	for _, m := range moves {
		if upto != 0 && m.LSN > upto {
			continue
		}
		v, ok := deltas[m.Move.Field]
		if !ok {
			continue
		}
		delete(deltas, m.Move.Field)
		if m.Move.To != "" {
			deltas[m.Move.To] += v
		}
	}
}

func (r *Reader) query(ctx context.Context, res *counter.Resolved, keys []string) ([]row, error) {
	args := []any{keys, r.opt.Slot}
	if res.Extremum {
		args = append(args, res.FilterArgs...)
	}
	rs, err := r.opt.Pool.Query(ctx, res.Read, args...)
	if err != nil {
		return nil, fmt.Errorf("read counter %s: %w", res.Counter.Name, err)
	}
	out, err := pgx.CollectRows(rs, func(cr pgx.CollectableRow) (row, error) {
		var x row
		var w *string
		err := cr.Scan(&w, &x.present, &x.column, &x.carried, &x.dirty, &x.now)
		if w == nil {
			return x, fmt.Errorf("walcount.checkpoint has no row for the slot %q", r.opt.Slot)
		}
		x.w = *w
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("read counter %s: %w", res.Counter.Name, err)
	}
	if len(out) != len(keys) {
		return nil, fmt.Errorf("read counter %s: %d rows for %d keys", res.Counter.Name, len(out), len(keys))
	}
	return out, nil
}

func parsePGLSN(s string) (LSN, error) {
	var hi, lo uint32
	if _, err := fmt.Sscanf(s, "%X/%X", &hi, &lo); err != nil {
		return 0, fmt.Errorf("parse lsn %q: %w", s, err)
	}
	return LSN(uint64(hi)<<32 | uint64(lo)), nil
}

// value renders one key's figures.
func value(res *counter.Resolved, x row, pending int64) Value {
	v := Value{Found: x.present || pending != 0, Dirty: x.dirty}
	if res.Extremum {
		v.Pending = strconv.FormatInt(pending, 10)
		if x.present && x.column != nil {
			v.Column = *x.column
		}
		v.Value = v.Column
		if pending != 0 && x.now != nil {
			v.Value = *x.now
		} else if pending != 0 {
			v.Value = ""
		}
		return v
	}
	var col int64
	if x.present && x.column != nil {
		col, _ = strconv.ParseInt(*x.column, 10, 64)
		v.Column = Scaled(col, res.Scale)
	}
	v.Pending = Scaled(pending, res.Scale)
	v.Value = Scaled(col+pending, res.Scale)
	return v
}

// Scaled renders n units of 10^-scale as a decimal.
func Scaled(n int64, scale int) string {
	if scale == 0 {
		return strconv.FormatInt(n, 10)
	}
	neg := n < 0
	u := uint64(n)
	if neg {
		u = uint64(-n)
	}
	s := strconv.FormatUint(u, 10)
	for len(s) <= scale {
		s = "0" + s
	}
	s = s[:len(s)-scale] + "." + s[len(s)-scale:]
	if neg {
		s = "-" + s
	}
	return s
}
