package aggregator

import (
	"fmt"
	"slices"

	"go.uber.org/zap"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
)

// The target rows' lifecycle (design rule 17). A counter column belongs to
// one incarnation of its target row. When the row is deleted, the deltas
// buffered for its key must not reach a row inserted later with the same
// key; when its key changes (ON UPDATE CASCADE), its deltas follow it, and
// the cascade that moves its likes to the new key must not count them
// twice. The target tables are published for their key columns, so their
// inserts, deletes and key changes arrive in the stream, in commit order
// with the likes, and act as barriers per key:
//
//   - a delete drops the deltas buffered for the key (in the transaction,
//     in the pending batch and, through a Move, in Redis), and the deltas
//     that follow it in the same transaction (its cascade), until the key
//     is inserted again;
//   - a key change moves them to the new key, and so do the deltas on the
//     old key that follow it in the transaction (the cascade moving likes
//     along with their row adds −n to the old key and +n to the new one,
//     which cancel);
//   - an insert ends both within the transaction.
//
// A flush already handed over cannot be changed that way: its deltas may
// be applied after a later delete or key change committed, to the wrong
// row or to none. Every flush therefore emits a marker in its own
// transaction, whose place in the stream says which lifecycle events it
// crossed; the flusher's FlushLog holds what it applied and which keys
// hit no row, and the aggregator adds the deltas that undo the misplaced
// part at the marker. Whether a key hit a row cannot be read from the
// stream: an UPDATE that waited on the lock of a row deleted and inserted
// again skips the old row and cannot see the new one, so only the
// statement knows.
// Without the record (a restart in between) the keys involved are marked
// dirty, to be reconciled (design rule 14). The events such a flush
// crossed may also be in what the old session buffered in Redis, which
// the new one flushes without streaming it again: that flush marks both
// ends of its batch's moves dirty itself (sink.Flusher.Inherit).

// targetRule is a counter whose target is a relation: key is the column
// index of its target key.
type targetRule struct {
	counter string
	key     int
	// column is the index of the counter column, -1 when the relation
	// does not carry it.
	column int
	// via is set for a counter of a via table, whose rows walcount
	// deletes only when they hold nothing (counter.ViaCollectSQL): a via
	// row is the sum of every delta for its key, so its delete is not the
	// end of a row, and the deltas on their way for the key (a parent
	// created again since) create it again.
	via bool
}

// bindTargets binds the counters whose target is rel. A delete can only be
// attributed when the target key is in the replica identity.
func bindTargets(rel *cdc.Relation, counters []counter.Counter, rels Relations) ([]targetRule, error) {
	var out []targetRule
	for _, c := range counters {
		if !rels.Is(c.Target, rel) {
			continue
		}
		i := rel.ColumnIndex(c.TargetKey)
		if i < 0 {
			return nil, fmt.Errorf("counter %s: %w: target key %q is not in %s", c.Name, ErrNotAttributable, c.TargetKey, rel.QualifiedName())
		}
		if rel.ReplicaIdentity != 'f' && !rel.Columns[i].Key {
			return nil, fmt.Errorf("counter %s: %w: target key %q of %s is not in its replica identity, so its deletes cannot be followed",
				c.Name, ErrNotAttributable, c.TargetKey, rel.QualifiedName())
		}
		out = append(out, targetRule{counter: c.Name, key: i, column: rel.ColumnIndex(c.Column), via: c.IsVia()})
	}
	return out, nil
}

// lifeEvent is one lifecycle event of a target key, at the end LSN of its
// transaction. to is the new field of a key change, "" for a delete;
// insert marks an insert, own one by walcount's own flush (a row a
// create_missing counter created).
type lifeEvent struct {
	lsn    cdc.LSN
	field  string
	to     string
	insert bool
	own    bool
}

// lifecycle is the aggregator's lifecycle state.
type lifecycle struct {
	// Of the current transaction: fields deleted (their later deltas are
	// dropped) or renamed (their later deltas go to the new field), the
	// moves to apply to what was buffered before it, and its events.
	dead   map[string]bool
	alias  map[string]string
	moves  []counter.Move
	events []lifeEvent
	// pendingMoves are the moves of the pending batch's transactions, in
	// order, for the Redis buffer.
	pendingMoves []counter.Move
	// log is every event since the last flush marker seen, for the
	// compensation of flushes that crossed them.
	log []lifeEvent
}

func newLifecycle() lifecycle {
	return lifecycle{dead: map[string]bool{}, alias: map[string]string{}}
}

// active reports whether the transaction has lifecycle events, which the
// deltas that follow must respect.
func (l *lifecycle) active() bool { return len(l.dead) > 0 || len(l.alias) > 0 }

// resetTxn forgets the transaction's state.
func (l *lifecycle) resetTxn() {
	clear(l.dead)
	clear(l.alias)
	l.moves = l.moves[:0]
	l.events = l.events[:0]
}

// target handles a change of a target relation.
func (a *Aggregator) target(ev *cdc.Event, rules []targetRule) error {
	for _, r := range rules {
		switch ev.Op {
		case cdc.OpInsert:
			k, ok, err := keyOf(ev.New, ev.Old, r.key)
			if err != nil || !ok {
				return wrapTarget(r, ev, err)
			}
			f := counter.Field(r.counter, k)
			a.inserted(f)
			if r.column >= 0 && r.column < len(ev.New.Cols) && !isZero(ev.New.Cols[r.column]) {
				a.seeded[f] = true
			}
		case cdc.OpDelete:
			if r.via {
				continue
			}
			k, ok, err := keyOf(ev.Old, ev.New, r.key)
			if err != nil || !ok {
				return wrapTarget(r, ev, err)
			}
			a.renamed(counter.Field(r.counter, k), "")
		case cdc.OpUpdate:
			if !ev.Old.Present() {
				// The replica identity did not change, and the target
				// key is in it: the key is the same.
				continue
			}
			ko, okOld, err := keyOf(ev.Old, ev.New, r.key)
			if err != nil {
				return wrapTarget(r, ev, err)
			}
			kn, okNew, err := keyOf(ev.New, ev.Old, r.key)
			if err != nil {
				return wrapTarget(r, ev, err)
			}
			if okOld && okNew && ko != kn {
				a.renamed(counter.Field(r.counter, ko), counter.Field(r.counter, kn))
			}
		}
	}
	return nil
}

// isZero reports whether a counter column's value is NULL or zero, as
// integer or numeric text ("0", "0.00", "-0").
func isZero(v cdc.Value) bool {
	if v.Kind != cdc.ValueText {
		return true // NULL; an unchanged TOASTed counter is not inserted
	}
	for _, c := range v.Data {
		if c != '0' && c != '.' && c != '-' && c != '+' {
			return false
		}
	}
	return true
}

func wrapTarget(r targetRule, ev *cdc.Event, err error) error {
	if err == nil {
		return nil // a NULL key: no row to follow
	}
	return fmt.Errorf("counter %s: %s on target %s: %w", r.counter, ev.Op, ev.Rel.QualifiedName(), err)
}

// keyOf returns the text of column i of t (alt standing in for an
// unchanged TOASTed value); ok is false for NULL.
func keyOf(t, alt cdc.Tuple, i int) (string, bool, error) {
	v, err := value(t, alt, i)
	if err != nil {
		return "", false, err
	}
	if v.Kind == cdc.ValueNull {
		return "", false, nil
	}
	return string(v.Data), true, nil
}

// inserted: a row with field's key exists from here on.
func (a *Aggregator) inserted(field string) {
	l := &a.lc
	delete(l.dead, field)
	delete(l.alias, field)
	l.events = append(l.events, lifeEvent{field: field, insert: true})
}

// renamed: the row of field is deleted (to == "") or now has the key of
// to. What was counted for it so far follows it.
func (a *Aggregator) renamed(field, to string) {
	l := &a.lc
	a.txn.move(field, to)
	l.moves = append(l.moves, counter.Move{Field: field, To: to})
	if to == "" {
		l.dead[field] = true
		delete(l.alias, field)
	} else {
		l.alias[field] = to
		delete(l.dead, field)
		// A row has key to from here on: the deltas on to that follow
		// are its own, whatever had the key before.
		delete(l.dead, to)
		delete(l.alias, to)
	}
	l.events = append(l.events, lifeEvent{field: field, to: to})
}

// redirect returns where a delta on field goes in a transaction with
// lifecycle events: "" to drop it.
func (l *lifecycle) redirect(field string) string {
	for range 64 { // a chain of renames in one transaction, bounded
		if l.dead[field] {
			return ""
		}
		to, ok := l.alias[field]
		if !ok {
			return field
		}
		field = to
	}
	return field
}

// commitLifecycle applies the transaction's moves to the pending batch
// (everything buffered before it that is not in Redis yet), queues them
// for Redis, and logs its events at end.
func (a *Aggregator) commitLifecycle(end cdc.LSN) {
	l := &a.lc
	for _, m := range l.moves {
		a.pending.move(m.Field, m.To)
	}
	l.pendingMoves = append(l.pendingMoves, l.moves...)
	for _, e := range l.events {
		e.lsn = end
		e.own = e.insert && a.ownFlush
		l.log = append(l.log, e)
	}
}

// flushSeen handles a flush marker: the flush of (…, upto] committed here.
// Every lifecycle event logged after upto happened between the flush's
// hand-over and its commit: the flush applied its deltas for those keys to
// the rows that had the keys at its commit, not to the rows they were
// counted for. The difference is added here, in the flush's own
// transaction, so it is applied exactly once with it.
func (a *Aggregator) flushSeen(content []byte, at cdc.LSN) (bool, error) {
	slot, upto, ok := cdc.ParseFlushMarker(content)
	if !ok {
		return false, nil
	}
	if slot != a.opt.Slot {
		return true, nil // another walcount's flush
	}
	a.ownFlush = true
	var deltas map[string]int64
	var missed map[string]bool
	known := false
	if a.opt.Flushes != nil {
		deltas, missed, known = a.opt.Flushes.Seen(upto, at, cdc.MarkerPiece(content))
	}
	l := &a.lc
	i := 0
	for i < len(l.log) && l.log[i].lsn <= upto {
		i++
	}
	crossed := l.log[i:]
	var fields []string
	for _, e := range crossed {
		if !slices.Contains(fields, e.field) {
			fields = append(fields, e.field)
		}
	}
	var dirty []string
	if !known {
		// Without the record, a delta of a crossed key may have landed on
		// the row that had the key at the flush's commit, or on none, and
		// it belonged to the row the key was counted for, which may now
		// have another key: both ends of every crossed event are dirty.
		for _, e := range crossed {
			for _, f := range []string{e.field, e.to} {
				if f != "" && !slices.Contains(dirty, f) {
					dirty = append(dirty, f)
				}
			}
		}
	}
	var sum crossing
	for _, f := range fields {
		if !known {
			break // marked dirty above
		}
		d := deltas[f]
		if d == 0 {
			continue
		}
		// A row with key f at the flush's commit is the last one to have
		// it: a row the UPDATE locked could not be deleted or re-keyed
		// before the flush committed. So when the key hit a row and the
		// row it was counted for still has the key, they are the same.
		should, went := follow(f, crossed, a.createsRows(f)), !missed[f]
		if should == f && went {
			continue // the same row
		}
		if went {
			a.add(f, -d)
		}
		if should != "" {
			a.add(should, d)
		}
		sum.note(f, should, went)
	}
	sum.log(a.log)
	if len(dirty) > 0 && a.opt.Marks != nil {
		if err := a.opt.Marks.Dirty(dirty, "a flush crossed a change of the target row and walcount restarted before it could follow it"); err != nil {
			return true, err
		}
	}
	// No later flush can cross what this one did not: later flushes start
	// after upto.
	l.log = append(l.log[:0], crossed...)
	return true, nil
}

// crossing sums up what one flush marker's compensations did, for one log
// line: a flush that crossed the lifecycle events of many keys (a batch of
// deletes, a table re-keyed) is one event, not one per key.
type crossing struct {
	moved, taken, given int
	examples            []zap.Field
}

// note records the compensation of field f: its delta belonged to should
// ("" for no row), and the flush applied it to the row that had the key
// at its commit (went) or to none.
func (c *crossing) note(f, should string, went bool) {
	switch {
	case should != "" && should != f:
		c.moved++ // the row was re-keyed: the delta follows it
	case should == "":
		c.taken++ // the row was deleted, or is not the one counted for
	default:
		c.given++ // the key had no row at the flush and has one now
	}
	if len(c.examples) < 3 {
		to := should
		if to == "" {
			to = "(no row)"
		}
		c.examples = append(c.examples, zap.String(f, to))
	}
}

func (c *crossing) log(log *zap.Logger) {
	if c.moved+c.taken+c.given == 0 {
		return
	}
	log.Info("a flush crossed changes of its target rows (deleted, re-keyed or created while it ran): their deltas go to the rows they were counted for",
		zap.Int("followed_rekey", c.moved), zap.Int("taken_back", c.taken), zap.Int("given_to_new_row", c.given),
		zap.Dict("examples", c.examples...))
}

// follow walks the events of the flush's crossing: where the delta on f
// belonged, the row that had key f at the hand-over followed through its
// key changes; "" once deleted, or when no row had key f then (its first
// event is an insert), unless creates: a create_missing counter's delta
// for a key with no row belongs to the row that gets the key next, the
// one the flush created or one the application inserted first. A row
// walcount's own flush created (own) is the row of every counter of its
// target: the flush that creates it updates it with the deltas of the
// other counters too, and the pieces of a big batch do so in separate
// transactions (an earlier piece creates the row, a later one updates it).
func follow(f string, events []lifeEvent, creates bool) string {
	should := f
	first := true
	for _, e := range events {
		if e.field == f && e.insert && first && !creates && !e.own {
			should = ""
		}
		if should != "" && !e.insert && e.field == should {
			should = e.to
		}
		if e.field == f || e.to == f {
			first = false
		}
	}
	return should
}

// createsRows reports whether the counter of field creates missing target
// rows (create_missing).
func (a *Aggregator) createsRows(field string) bool {
	name, _, _ := counter.SplitField(field)
	for _, c := range a.opt.Counters {
		if c.Name == name {
			return c.CreateMissing
		}
	}
	return false
}
