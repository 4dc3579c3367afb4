package aggregator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/internal/metrics"
)

// Defaults of Options.
const (
	// DefaultMaxPendingKeys caps the distinct keys coalesced in memory
	// before they are written to Redis.
	DefaultMaxPendingKeys = 50_000
	// DefaultMaxPendingAge caps how long committed deltas wait in memory
	// before they are written to Redis.
	DefaultMaxPendingAge = 25 * time.Millisecond
)

// Buffer is the part of the Redis buffer the aggregator writes.
type Buffer interface {
	// Apply runs moves on the buffered deltas, adds deltas for the
	// transactions in (prev, last] and moves the chain to last, in one
	// atomic step; it reports false for a batch already applied.
	Apply(ctx context.Context, prev, last cdc.LSN, moves []counter.Move, deltas []counter.Delta) (bool, error)
}

// Spiller is a Buffer that takes a source transaction's deltas before its
// COMMIT, in parts (buffer.Redis): Spill writes part of a transaction not
// committed yet, tagged with tag, and returns the parts written so far;
// ApplyAfter ends it at the COMMIT as Apply would. Until ApplyAfter the
// buffer is marked as written in parts: nothing hands it over, and a
// session that starts with it so discards it and replays from W.
type Spiller interface {
	Spill(ctx context.Context, prev, tag cdc.LSN, done int, deltas []counter.Delta) (int, error)
	ApplyAfter(ctx context.Context, prev, last, tag cdc.LSN, done int, moves []counter.Move, deltas []counter.Delta) (bool, error)
}

// ErrRespill ends a session whose aggregator wrote part of a source
// transaction to Redis before it met a change that needs the whole
// transaction in memory (a TRUNCATE of a source, which erases the
// transaction's earlier deltas). The transaction is refused spilling
// (Refusals) and the next session, which discards the parts, replays it.
var ErrRespill = errors.New("a source transaction written to redis in parts before its commit must be replayed whole")

// Refusals remembers, across sessions, the source transactions (by their
// commit record's start) that must be held whole in memory. Its methods
// are safe for concurrent use.
type Refusals struct {
	mu   sync.Mutex
	lsns map[cdc.LSN]bool
}

// Refuse marks the transaction whose commit record starts at lsn.
func (r *Refusals) Refuse(lsn cdc.LSN) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lsns == nil {
		r.lsns = map[cdc.LSN]bool{}
	}
	r.lsns[lsn] = true
}

// Refused reports whether the transaction at lsn was refused.
func (r *Refusals) Refused(lsn cdc.LSN) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lsns[lsn]
}

// Barrierer applies a TRUNCATE barrier; the sink implements it.
type Barrierer interface {
	Barrier(ctx context.Context, end cdc.LSN, reset []string, deltas []counter.Delta) error
}

// CommitRecorder is told the commit time of every applied transaction
// (for walcount_apply_lag_seconds).
type CommitRecorder interface {
	Record(end cdc.LSN, commit time.Time)
}

// Reconciliation is what reconciliation follows of the stream, at the
// aggregator's place in it (reconcile.Recorder): the messages that time
// its measurements and carry its corrections, and the transactions
// committed meanwhile.
type Reconciliation interface {
	// HandleMessage receives walcount's own logical messages (prefix
	// "walcount") that are not the flushes' markers or quiet messages. It
	// may return deltas, which are added to the message's transaction as
	// ordinary deltas.
	HandleMessage(end cdc.LSN, xid uint32, content []byte) ([]counter.Delta, error)
	// Observe sees every committed transaction with its deltas (before
	// coalescing across transactions), the counters it truncated and the
	// buffered deltas its target lifecycle events moved or dropped. deltas
	// and moved are valid only during the call.
	Observe(xid uint32, end cdc.LSN, deltas iter.Seq2[string, int64], truncated map[string]bool, moved []counter.Move)
}

// FlushLog holds what each flush applied, so that a flush that crossed a
// target row's lifecycle event can be followed (see lifecycle.go). Seen
// returns the deltas of the flush of (…, upto], which committed at at in
// the stream, and the fields whose UPDATE hit no row; ok is false when
// walcount no longer knows them.
type FlushLog interface {
	Seen(upto, at cdc.LSN, piece string) (deltas map[string]int64, missed map[string]bool, ok bool)
}

// Marks records, durably, what walcount cannot vouch for, so that
// reconciliation measures it (design rule 14): counter keys (buffer
// fields) or whole counters marked dirty, and a counter that can no longer
// be kept from the stream (degraded, with why: its source's replica
// identity lost a column it reads), or can again (the daemon marks it
// dirty at the first and lets reconciliation repair it after the second).
//
// Dirty, DirtyCounters and Degraded only enqueue: they never wait for
// PostgreSQL, and return an error only when an earlier write has already
// failed. Sync waits until every mark enqueued before it is written and
// returns the first write error. The aggregator calls Sync before it hands
// a transaction to Redis (Buffer.Apply, Barrierer.Barrier): a restart
// skips the transactions Redis holds, so a mark caused by one must be
// durable before it is there, and so before W can pass it. A write error
// ends the session, as the synchronous write did.
type Marks interface {
	Dirty(fields []string, cause string) error
	DirtyCounters(counters []string, cause string) error
	Degraded(counter string, degraded bool, why string) error
	Sync(ctx context.Context) error
}

// Options configure an Aggregator.
type Options struct {
	// Slot names the slot whose flush markers this aggregator follows.
	Slot     string
	Counters []counter.Counter
	// Relations binds the counters' tables to their OIDs; nil matches
	// them by name.
	Relations Relations
	// Derived maps a counter whose summed column is generated to the
	// column's derivation from the columns the stream carries (pgoutput
	// leaves generated columns out).
	Derived map[string]*counter.Derivation
	Buffer  Buffer
	Barrier Barrierer
	// Start is the end LSN of the last transaction Redis or PostgreSQL
	// already holds (meta.lsn): the chain continues from it and every
	// transaction ending at or before it is skipped.
	Start cdc.LSN
	// Commits, Reconciliation, Flushes and Marks are optional.
	Commits        CommitRecorder
	Reconciliation Reconciliation
	Flushes        FlushLog
	Marks          Marks
	// WasDegraded are the counters an earlier session reported degraded:
	// the first binding that finds their source's identity whole again
	// reports them keepable.
	WasDegraded []string
	// MaxPendingKeys: default DefaultMaxPendingKeys.
	MaxPendingKeys int
	// MaxPendingAge: default DefaultMaxPendingAge.
	MaxPendingAge time.Duration
	// TransactionKeys bounds the distinct keys of one source transaction
	// held in memory: past it, the transaction's deltas so far are written
	// to Redis before its COMMIT (Spiller), when the Buffer can and
	// Refusals is set; 0 holds every transaction whole.
	TransactionKeys int
	// Refusals are the transactions to hold whole (see ErrRespill).
	Refusals *Refusals
	Metrics  *metrics.Metrics
	// Tally, when not nil, counts the changes per counter and operation
	// for /status, across sessions.
	Tally  *counter.Tally
	Logger *zap.Logger
	// Failpoints are armed by crash tests; nil in production.
	Failpoints *failpoint.Set
}

// Aggregator consumes the cdc stream. It is used by one goroutine.
type Aggregator struct {
	opt     Options
	log     *zap.Logger
	rules   map[*cdc.Relation][]rule
	targets map[*cdc.Relation][]targetRule
	lc      lifecycle
	// degraded is each counter's last degraded state reported.
	degraded map[string]bool

	// prev is the chain tip in Redis: the last end LSN written.
	prev cdc.LSN

	// The last transaction a forged message was logged for.
	forgedXid    uint32
	forgedLogged bool

	// Current transaction.
	inTxn bool
	// begin is the start of its commit record (BEGIN's final LSN);
	// spilled counts the parts of it written to Redis before its COMMIT.
	begin   cdc.LSN
	spilled int
	skip    bool
	xid     uint32
	txn     deltaSet
	keyBuf  []byte
	resets  map[string]bool
	// What the transaction made walcount unable to vouch for (design rule
	// 17): counters whose target it truncated, and target rows it inserted
	// with a counter value already in them (a restore, a copy).
	truncated map[string]bool
	seeded    map[string]bool
	// extremum holds the names of the max and min counters.
	extremum map[string]bool
	// ownFlush: the transaction is one of this slot's flushes (it carries
	// its marker), whose inserts of target rows are the rows
	// create_missing counters created, not seeded rows.
	ownFlush bool
	// stray maps the append_only counters whose source this transaction
	// updated or deleted from to the source's name.
	stray map[string]string
	// quiet holds the counters this transaction's changes are no deltas
	// of: a trusted quiet message of this slot named them (a backfill's
	// corrections written into a via table, whose level above is
	// backfilled after them; see cdc.QuietMessage).
	quiet map[string]bool

	// Pending batch: committed transactions not yet in Redis.
	pending      deltaSet
	pendingLast  cdc.LSN
	pendingSince time.Time
	pendingTxns  int
	scratch      []counter.Delta
}

// New returns an Aggregator continuing the chain at opt.Start.
func New(opt Options) *Aggregator {
	if opt.MaxPendingKeys <= 0 {
		opt.MaxPendingKeys = DefaultMaxPendingKeys
	}
	if opt.MaxPendingAge <= 0 {
		opt.MaxPendingAge = DefaultMaxPendingAge
	}
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	if opt.Metrics == nil {
		opt.Metrics = metrics.New()
	}
	extremum := map[string]bool{}
	for _, c := range opt.Counters {
		if v, _ := c.Extremum(); v != "" {
			extremum[c.Name] = true
		}
	}
	return &Aggregator{
		extremum:  extremum,
		opt:       opt,
		log:       opt.Logger,
		rules:     make(map[*cdc.Relation][]rule),
		targets:   make(map[*cdc.Relation][]targetRule),
		degraded:  degradedSet(opt.WasDegraded),
		lc:        newLifecycle(),
		prev:      opt.Start,
		txn:       newDeltaSet(),
		resets:    make(map[string]bool),
		truncated: make(map[string]bool),
		seeded:    make(map[string]bool),
		stray:     make(map[string]string),
		quiet:     make(map[string]bool),
		pending:   newDeltaSet(),
	}
}

// Position returns the end LSN of the last transaction written to Redis.
func (a *Aggregator) Position() cdc.LSN { return a.prev }

// Run consumes batches until in is closed, then writes what is pending,
// or until ctx is done, then returns at once. release, if not nil, gets every consumed batch back.
func (a *Aggregator) Run(ctx context.Context, in <-chan *cdc.Batch, release func(*cdc.Batch)) error {
	// The pending batch goes to Redis once it is MaxPendingAge old or
	// MaxPendingKeys big, not after every transaction: at a few thousand
	// single-row transactions a second, one script call per transaction
	// would cost more CPU than everything else walcount does. The age
	// bound adds at most MaxPendingAge to the flush interval.
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	armed := false
	for {
		select {
		case b, ok := <-in:
			if !ok {
				return a.writePending(ctx)
			}
			if err := a.Process(ctx, b.Events); err != nil {
				return err
			}
			if release != nil {
				release(b)
			}
		case <-timer.C:
			armed = false
		case <-ctx.Done():
			// Stopped from outside: the session is being torn down
			// after an error, so write nothing more. A clean shutdown
			// closes in instead.
			return nil
		}
		if a.pendingTxns == 0 {
			continue
		}
		age := time.Since(a.pendingSince)
		if a.pending.size() >= a.opt.MaxPendingKeys || age >= a.opt.MaxPendingAge {
			if err := a.writePending(ctx); err != nil {
				return err
			}
			continue
		}
		if !armed {
			timer.Reset(a.opt.MaxPendingAge - age)
			armed = true
		}
	}
}

// Process handles events in order. It writes to Redis only for TRUNCATE
// barriers; call Flush to write the pending batch.
func (a *Aggregator) Process(ctx context.Context, events []cdc.Event) error {
	for i := range events {
		if err := a.handle(ctx, &events[i]); err != nil {
			return err
		}
	}
	return nil
}

// Flush writes the pending batch to Redis.
func (a *Aggregator) Flush(ctx context.Context) error { return a.writePending(ctx) }

func (a *Aggregator) handle(ctx context.Context, ev *cdc.Event) error {
	switch ev.Kind {
	case cdc.KindBegin:
		a.inTxn, a.xid = true, ev.Xid
		a.begin, a.spilled = ev.LSN, 0
		// ev.LSN is the commit record's start. Commit records do not
		// overlap, so it lies below prev exactly when the transaction's
		// end LSN is at or below prev: already applied.
		a.skip = ev.LSN < a.prev
		a.txn.reset()
		clear(a.resets)
		clear(a.truncated)
		clear(a.seeded)
		clear(a.stray)
		clear(a.quiet)
		a.ownFlush = false
		a.lc.resetTxn()
	case cdc.KindChange:
		if a.skip {
			return nil
		}
		if err := a.change(ev); err != nil {
			return err
		}
		if a.txn.size() >= a.opt.TransactionKeys && a.spillable() {
			if err := a.spill(ctx); err != nil {
				return err
			}
		}
		return a.opt.Failpoints.Inject(failpoint.MidTransaction)
	case cdc.KindTruncate:
		if a.skip {
			return nil
		}
		for _, rel := range ev.Rels {
			for _, c := range a.opt.Counters {
				if !a.opt.Relations.Is(c.Source, rel) {
					continue
				}
				if a.spilled > 0 {
					// The TRUNCATE erases the transaction's earlier
					// deltas, some of which are in Redis already.
					a.opt.Refusals.Refuse(a.begin)
					a.log.Warn("a source transaction written to redis in parts truncates a source: it is replayed and held whole in memory",
						zap.Uint32("xid", a.xid), zap.Stringer("commit_lsn", a.begin))
					return fmt.Errorf("truncate of %s at %s: %w", rel.QualifiedName(), a.begin, ErrRespill)
				}
				a.resets[c.Name] = true
				a.opt.Metrics.Changes.WithLabelValues(c.Name, "truncate").Inc()
				a.opt.Tally.Add(c.Name, "truncate", 1)
				// Deltas of this counter earlier in the transaction are
				// erased by the TRUNCATE.
				a.txn.dropCounter(c.Name)
			}
			for _, c := range a.opt.Counters {
				if a.opt.Relations.Is(c.Target, rel) {
					// Every row of the target is new from here on.
					a.truncated[c.Name] = true
				}
			}
		}
	case cdc.KindMessage:
		if a.skip || ev.Prefix != cdc.MessagePrefix {
			return nil
		}
		if !ev.Trusted {
			// Any role may emit a message (design rule 18): walcount's
			// own come as rows of its table of messages.
			a.untrusted(ev)
			return nil
		}
		if ok, err := a.flushSeen(ev.Content, ev.LSN); ok || err != nil {
			return err
		}
		if slot, names, ok := cdc.ParseQuiet(ev.Content); ok {
			if slot == a.opt.Slot {
				for _, n := range names {
					a.quiet[n] = true
				}
			}
			return nil
		}
		if a.opt.Reconciliation == nil {
			return nil
		}
		ds, err := a.opt.Reconciliation.HandleMessage(ev.LSN, a.xid, ev.Content)
		if err != nil {
			return err
		}
		for _, d := range ds {
			a.add(d.Field, d.N)
		}
	case cdc.KindCommit:
		a.inTxn = false
		if a.skip || ev.LSN <= a.prev || ev.LSN <= a.pendingLast {
			a.skip = false
			return nil
		}
		return a.commit(ctx, ev)
	}
	return nil
}

// actingTags are the members by which a message would act on counts, the
// flush, the lifecycle handling or a reconciliation; a heartbeat has none.
var actingTags = [][]byte{[]byte(`"flush"`), []byte(`"reconcile"`), []byte(`"correct"`), []byte(`"quiet":`)}

// untrusted handles a message in walcount's form that any role could have
// emitted: one that would act is a forgery, counted and logged once per
// transaction, and ignored like every untrusted message.
func (a *Aggregator) untrusted(ev *cdc.Event) {
	forged := false
	for _, tag := range actingTags {
		if bytes.Contains(ev.Content, tag) {
			forged = true
			break
		}
	}
	if !forged {
		return
	}
	a.opt.Metrics.ForgedMessages.Inc()
	if a.forgedXid == a.xid && a.forgedLogged {
		return
	}
	a.forgedXid, a.forgedLogged = a.xid, true
	content := ev.Content
	if len(content) > 200 {
		content = content[:200]
	}
	a.log.Error("ignored a forged walcount message: it was emitted with pg_logical_emit_message, which any role may call, not written to walcount's table of messages; find the sender by its transaction id",
		zap.Uint32("xid", a.xid), zap.Stringer("lsn", ev.LSN), zap.ByteString("content", content))
}

// checkName warns once per relation when a relation a counter is bound to
// by its OID arrives under another name: it was renamed, and is followed by
// its identity (the daemon decides at its next session whether the name
// now designates another table).
func (a *Aggregator) checkName(rel *cdc.Relation) {
	for name, oid := range a.opt.Relations {
		if oid != rel.ID {
			continue
		}
		if schema, table := counter.SplitTable(name); schema != rel.Namespace || table != rel.Name {
			a.log.Warn("a table walcount counts was renamed: it is followed by its identity; rename it back, or name it so in the configuration and run walcount setup",
				zap.String("configured", name), zap.String("now", rel.QualifiedName()), zap.Uint32("oid", rel.ID))
		}
	}
}

func (a *Aggregator) change(ev *cdc.Event) error {
	targets, ok := a.targets[ev.Rel]
	if !ok {
		var err error
		a.checkName(ev.Rel)
		if targets, err = bindTargets(ev.Rel, a.opt.Counters, a.opt.Relations); err != nil {
			return fmt.Errorf("bind counter targets to %s: %w", ev.Rel.QualifiedName(), err)
		}
		a.targets[ev.Rel] = targets
	}
	if len(targets) > 0 {
		if err := a.target(ev, targets); err != nil {
			return err
		}
	}
	rules, ok := a.rules[ev.Rel]
	if !ok {
		var err error
		if rules, err = bindRules(ev.Rel, a.opt.Counters, a.opt.Relations, a.opt.Derived); err != nil {
			return fmt.Errorf("bind counters to %s: %w", ev.Rel.QualifiedName(), err)
		}
		for i := range rules {
			for _, op := range []cdc.Op{cdc.OpInsert, cdc.OpUpdate, cdc.OpDelete} {
				rules[i].changed[op] = a.opt.Metrics.Changes.WithLabelValues(rules[i].counter, op.String())
				rules[i].tallied[op] = a.opt.Tally.Cell(rules[i].counter, op.String())
			}
			if err := a.reportDegraded(&rules[i]); err != nil {
				return err
			}
		}
		a.rules[ev.Rel] = rules
	}
	for i := range rules {
		r := &rules[i]
		if len(a.quiet) > 0 && a.quiet[r.counter] {
			continue // walcount's own correction of a level below (cdc.QuietMessage)
		}
		r.changed[ev.Op].Inc()
		r.tallied[ev.Op].Add(1)
		if r.appendOnly && ev.Op != cdc.OpInsert {
			// Declared append-only: the old row may not carry what the
			// counter reads. Not counted; the counter is dirty.
			a.stray[r.counter] = ev.Rel.QualifiedName()
			continue
		}
		if r.degraded && ev.Op != cdc.OpInsert {
			// The old row lacks a column the rule reads: not
			// attributable. The counter is dirty until reconciled.
			continue
		}
		oldC, err := r.contribute(ev.Old, ev.New)
		if err != nil {
			return fmt.Errorf("counter %s: %s on %s: %w", r.counter, ev.Op, ev.Rel.QualifiedName(), err)
		}
		newC, err := r.contribute(ev.New, ev.Old)
		if err != nil {
			return fmt.Errorf("counter %s: %s on %s: %w", r.counter, ev.Op, ev.Rel.QualifiedName(), err)
		}
		if ev.Op == cdc.OpUpdate && !ev.Old.Present() {
			// No old image: the replica identity columns did not change,
			// and bindRules made sure every column the rule reads is one
			// of them, so the old contribution equals the new one.
			continue
		}
		if oldC.ok && newC.ok && oldC.amount == newC.amount && string(oldC.key) == string(newC.key) && string(oldC.val) == string(newC.val) {
			continue
		}
		if r.ext >= 0 {
			// An extremum: the key's rows changed, so its column is
			// computed again at the flush (see counter.Resolved.Extremum).
			// Only positive counts, so that no sum of them cancels.
			if oldC.ok {
				a.addKey(r.counter, oldC.key, 1)
			}
			if newC.ok && (!oldC.ok || string(oldC.key) != string(newC.key)) {
				a.addKey(r.counter, newC.key, 1)
			}
			continue
		}
		if oldC.ok && oldC.amount != 0 {
			a.addKey(r.counter, oldC.key, -oldC.amount)
		}
		if newC.ok && newC.amount != 0 {
			a.addKey(r.counter, newC.key, newC.amount)
		}
	}
	return nil
}

// reportDegraded tells the daemon when a rule's binding changes whether its
// counter can be kept.
func (a *Aggregator) reportDegraded(r *rule) error {
	if a.degraded[r.counter] == r.degraded {
		return nil
	}
	a.degraded[r.counter] = r.degraded
	if r.degraded {
		a.log.Warn("a counter cannot be kept from the stream: only inserts are counted until the replica identity is back, and then it is reconciled",
			zap.String("counter", r.counter), zap.String("why", r.why))
	} else {
		a.log.Info("a counter can be kept from the stream again", zap.String("counter", r.counter))
	}
	if a.opt.Marks == nil {
		return nil
	}
	return a.opt.Marks.Degraded(r.counter, r.degraded, r.why)
}

func degradedSet(names []string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

func (a *Aggregator) addKey(name string, key []byte, n int64) {
	if !a.lc.active() {
		a.txn.addField(&a.keyBuf, name, key, n)
		return
	}
	if f := a.lc.redirect(counter.Field(name, string(key))); f != "" {
		a.txn.add(f, n)
	}
}

// add adds n to field. A delta of an extremum counter (a correction, a
// flush's crossing undone) only asks for a recompute: it is counted as +1,
// so that no sum of its deltas cancels to zero.
func (a *Aggregator) add(field string, n int64) {
	if n != 0 && len(a.extremum) > 0 {
		if name, _, ok := counter.SplitField(field); ok && a.extremum[name] {
			n = 1
		}
	}
	a.txn.add(field, n)
}

// commit merges the transaction into the pending batch, or runs it as a
// barrier when it truncated a source table.
func (a *Aggregator) commit(ctx context.Context, ev *cdc.Event) error {
	a.opt.Metrics.Transactions.Inc()
	if err := a.markUnvouched(); err != nil {
		return err
	}
	if a.opt.Reconciliation != nil {
		a.opt.Reconciliation.Observe(a.xid, ev.LSN, a.txn.all(), a.resets, a.lc.moves)
	}
	a.commitLifecycle(ev.LSN)
	if a.spilled > 0 {
		return a.commitSpilled(ctx, ev)
	}
	if len(a.resets) > 0 {
		if err := a.writePending(ctx); err != nil {
			return err
		}
		reset := make([]string, 0, len(a.resets))
		for name := range a.resets {
			reset = append(reset, name)
		}
		deltas := make([]counter.Delta, 0, a.txn.size())
		for f, n := range a.txn.all() {
			deltas = append(deltas, counter.Delta{Field: f, N: n})
		}
		if err := a.syncMarks(ctx); err != nil {
			return err
		}
		if err := a.opt.Barrier.Barrier(ctx, ev.LSN, reset, deltas); err != nil {
			return fmt.Errorf("truncate barrier at %s: %w", ev.LSN, err)
		}
		a.prev = ev.LSN
		return nil
	}
	for f, n := range a.txn.all() {
		a.pending.add(f, n)
	}
	if a.pendingTxns == 0 {
		a.pendingSince = time.Now()
	}
	a.pendingTxns++
	a.pendingLast = ev.LSN
	if a.opt.Commits != nil {
		a.opt.Commits.Record(ev.LSN, ev.Time)
	}
	return nil
}

// maxSeededKeys is how many seeded keys of one counter in one transaction
// are marked dirty one by one; more (a restore of a whole table) mark the
// counter.
const maxSeededKeys = 10_000

// markUnvouched marks dirty, before the transaction's deltas go anywhere,
// what it made walcount unable to vouch for: a counter whose target it
// truncated (the rows after it are new, and a flush in flight may have
// landed on them), and the keys of target rows it inserted with a non-zero
// counter value (restored or copied rows already count what walcount will
// add). Reconciliation then makes them exact (design rule 14).
func (a *Aggregator) markUnvouched() error {
	if len(a.stray) > 0 {
		names := slices.Sorted(maps.Keys(a.stray))
		a.log.Warn("an append_only source took an UPDATE or DELETE: it is not counted, the counter is marked dirty and reconciliation makes it exact; if the table does take updates, remove append_only and give it a replica identity that carries the counter's columns",
			zap.Strings("counters", names), zap.String("source", a.stray[names[0]]))
		if a.opt.Marks != nil {
			if err := a.opt.Marks.DirtyCounters(names, "its source is declared append_only but took an UPDATE or DELETE, which walcount does not count"); err != nil {
				return err
			}
		}
		clear(a.stray)
	}
	if a.ownFlush {
		// The rows a flush inserted are those its create_missing
		// counters created, each holding the delta it counted.
		clear(a.seeded)
	}
	if len(a.truncated) == 0 && len(a.seeded) == 0 {
		return nil
	}
	whole := slices.Sorted(maps.Keys(a.truncated))
	byCounter := map[string][]string{}
	for f := range a.seeded {
		name, _, _ := counter.SplitField(f)
		if !a.truncated[name] {
			byCounter[name] = append(byCounter[name], f)
		}
	}
	var fields []string
	for name, fs := range byCounter {
		if len(fs) > maxSeededKeys {
			whole = append(whole, name)
			continue
		}
		fields = append(fields, fs...)
	}
	if len(whole) > 0 {
		a.log.Warn("a target table was truncated, or filled with rows whose counters already hold values: walcount marks the counters dirty and reconciliation makes them exact",
			zap.Strings("counters", whole))
		if a.opt.Marks != nil {
			if err := a.opt.Marks.DirtyCounters(whole, "the target table was truncated or restored: its rows are new, and their counters hold values walcount did not count"); err != nil {
				return err
			}
		}
	}
	if len(fields) > 0 && a.opt.Marks != nil {
		slices.Sort(fields)
		if err := a.opt.Marks.Dirty(fields, "a target row was inserted with a non-zero counter value (a restore or a copy): walcount cannot tell what it already counts"); err != nil {
			return err
		}
	}
	return nil
}

// spillable reports whether the current transaction's deltas so far may
// be written to Redis before its COMMIT: the buffer takes parts, and the
// transaction has neither truncated a source (which erases deltas of its
// own before) nor deleted or re-keyed a target row (its moves run at the
// COMMIT on everything buffered before, which holds the parts written so
// far: a part written after a move would hold deltas the move must not
// touch). So a transaction of likes is written as it streams, and a rare
// one that mixes a bulk of likes with target deletes is held whole past
// its first delete.
func (a *Aggregator) spillable() bool {
	if a.opt.TransactionKeys <= 0 || a.opt.Refusals == nil || a.skip {
		return false
	}
	if _, ok := a.opt.Buffer.(Spiller); !ok {
		return false
	}
	return len(a.resets) == 0 && len(a.lc.moves) == 0 && !a.lc.active() && !a.opt.Refusals.Refused(a.begin)
}

// spill writes the current transaction's deltas so far to Redis, as parts
// of its write in parts tagged with its commit record's start + 1 (past
// the chain's tip, at or below its end; see buffer's applyScript), and
// forgets them. The pending batch goes first, so that the chain is at its
// tip and the parts are this transaction's alone.
func (a *Aggregator) spill(ctx context.Context) error {
	if a.spilled == 0 {
		if err := a.writePending(ctx); err != nil {
			return err
		}
		a.log.Info("a source transaction passed aggregator_transaction_keys: writing it to redis in parts before its commit",
			zap.Uint32("xid", a.xid), zap.Stringer("commit_lsn", a.begin), zap.Int("keys", a.txn.size()))
	}
	if a.opt.Reconciliation != nil {
		// Reconciliation sees the transaction in parts, each as of its
		// commit record (+1: past a W that ends where it starts).
		a.opt.Reconciliation.Observe(a.xid, a.begin+1, a.txn.all(), a.resets, nil)
	}
	a.scratch = a.scratch[:0]
	for f, n := range a.txn.all() {
		a.scratch = append(a.scratch, counter.Delta{Field: f, N: n})
	}
	n, err := a.opt.Buffer.(Spiller).Spill(ctx, a.prev, a.begin+1, a.spilled, a.scratch)
	if err != nil {
		return err
	}
	a.spilled = n
	a.txn.reset()
	return a.opt.Failpoints.Inject(failpoint.AfterSpill)
}

// commitSpilled ends a transaction written in parts: its remaining deltas
// and its moves (which run on everything before them, its parts
// included) go to Redis as the last parts, which move the chain to its
// end.
func (a *Aggregator) commitSpilled(ctx context.Context, ev *cdc.Event) error {
	if err := a.syncMarks(ctx); err != nil {
		return err
	}
	a.scratch = a.scratch[:0]
	for f, n := range a.txn.all() {
		a.scratch = append(a.scratch, counter.Delta{Field: f, N: n})
	}
	if _, err := a.opt.Buffer.(Spiller).ApplyAfter(ctx, a.prev, ev.LSN, a.begin+1, a.spilled, a.lc.pendingMoves, a.scratch); err != nil {
		return err
	}
	a.lc.pendingMoves = a.lc.pendingMoves[:0]
	a.prev = ev.LSN
	a.spilled = 0
	a.txn.reset()
	if a.opt.Commits != nil {
		a.opt.Commits.Record(ev.LSN, ev.Time)
	}
	return a.opt.Failpoints.Inject(failpoint.AfterApply)
}

// writePending writes the pending batch to Redis in one script call.
func (a *Aggregator) writePending(ctx context.Context) error {
	if a.pendingTxns == 0 || a.pendingLast <= a.prev {
		return nil
	}
	if err := a.syncMarks(ctx); err != nil {
		return err
	}
	a.scratch = a.scratch[:0]
	for f, n := range a.pending.all() {
		a.scratch = append(a.scratch, counter.Delta{Field: f, N: n})
	}
	if _, err := a.opt.Buffer.Apply(ctx, a.prev, a.pendingLast, a.lc.pendingMoves, a.scratch); err != nil {
		return err
	}
	a.lc.pendingMoves = a.lc.pendingMoves[:0]
	a.prev = a.pendingLast
	a.pending.reset()
	a.pendingTxns = 0
	return a.opt.Failpoints.Inject(failpoint.AfterApply)
}

// syncMarks waits until the marks of the transactions about to go to
// Redis are written (see Marks).
func (a *Aggregator) syncMarks(ctx context.Context) error {
	if a.opt.Marks == nil {
		return nil
	}
	return a.opt.Marks.Sync(ctx)
}
