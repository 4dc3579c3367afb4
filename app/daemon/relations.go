package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/walcount/walcount/aggregator"
	"github.com/walcount/walcount/counter"
)

// The tables a counter names, followed by their identity (design rule 17).
// A relation keeps its OID through a rename and the stream names each
// change by it, so a session binds each configured name to the OID it
// designates when the session starts: a renamed source is still counted.
// A name that comes to designate another relation (a table swapped for a
// copy by rename, as online schema-change tools do) or a relation the
// publication does not hold cannot be kept from the stream: its changes
// are not there. Such a counter is marked dirty and kept out of
// reconciliation (not keepable) until the name designates a published
// relation again; a poller ends the session when what the names designate
// changes, so that the next session binds them anew.

// relation is what one configured table name designates.
type relation struct {
	oid       uint32 // 0: no relation has the name
	published bool
}

// errRelationsChanged ends a session whose tables changed identity.
var errRelationsChanged = errors.New("a table walcount counts was renamed, replaced or left the publication")

// relationNames returns the distinct source and target names.
func (d *Daemon) relationNames() []string {
	var names []string
	for _, c := range d.cfg.Counters {
		for _, n := range []string{c.Source, c.Target} {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	return names
}

// readRelations reads what each configured table name designates now.
func (d *Daemon) readRelations(ctx context.Context) (map[string]relation, error) {
	out := map[string]relation{}
	for _, name := range d.relationNames() {
		schema, table := counter.SplitTable(name)
		var r relation
		err := d.pool.QueryRow(ctx, `
SELECT coalesce(to_regclass($1)::oid, 0),
       EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $2 AND schemaname = $3 AND tablename = $4)`,
			pgx.Identifier{schema, table}.Sanitize(), d.cfg.Publication, schema, table).Scan(&r.oid, &r.published)
		if err != nil {
			return nil, fmt.Errorf("read relation %s: %w", name, err)
		}
		out[name] = r
	}
	return out, nil
}

// bindRelations binds the counters' tables for a session: each name to
// the OID it designates now. A counter whose source or target is not a
// published relation is marked dirty and kept from reconciliation; one
// whose table is another relation than the last session's is marked dirty.
// (A session cannot start while a name designates nothing: the flusher
// refuses it first, and the daemon stops with the error.)
func (d *Daemon) bindRelations(ctx context.Context) (aggregator.Relations, map[string]relation, error) {
	now, err := d.readRelations(ctx)
	if err != nil {
		return nil, nil, err
	}
	d.mu.Lock()
	prev := d.state.bound
	d.mu.Unlock()
	bound := aggregator.Relations{}
	why := map[string]string{}      // name → why its counters cannot be kept
	replaced := map[string]string{} // name → why its counters are dirty
	for name, r := range now {
		was := prev[name]
		switch {
		case r.oid == 0:
			why[name] = fmt.Sprintf("%s does not exist", name)
		default:
			bound[name] = r.oid
			if !r.published {
				why[name] = fmt.Sprintf("%s is not in publication %s, so its changes are not in the stream (replaced by a copy, or taken out of the publication): run walcount setup", name, d.cfg.Publication)
			} else if was != 0 && was != r.oid {
				replaced[name] = fmt.Sprintf("%s is another table than before (oid %d, was %d): walcount did not see its history", name, r.oid, was)
			}
		}
	}
	unbound := map[string]string{}
	for _, c := range d.cfg.Counters {
		dirty := ""
		for _, n := range []string{c.Source, c.Target} {
			if w, ok := why[n]; ok {
				unbound[c.Name], dirty = w, w
			} else if w, ok := replaced[n]; ok && dirty == "" {
				dirty = w
			}
		}
		// A table out of the publication, or another one than before,
		// has changes walcount did not see.
		if dirty == "" {
			continue
		}
		if err := d.markCountersDirty([]string{c.Name}, dirty); err != nil {
			return nil, nil, err
		}
		if w, ok := unbound[c.Name]; ok {
			d.log.Error("a counter cannot be kept from the stream until its tables are what the publication holds; it is marked dirty and repaired once they are",
				zap.String("counter", c.Name), zap.String("why", w))
		}
	}
	d.mu.Lock()
	d.state.bound = maps.Clone(bound)
	d.state.unbound = unbound
	d.mu.Unlock()
	return bound, now, nil
}

// watchRelations ends the session when what a configured table name
// designates another relation than the session bound, or one that entered
// or left the publication: the next session binds it anew and says what it
// found.
func (d *Daemon) watchRelations(ctx context.Context, at map[string]relation) error {
	return everyTick(ctx, d.cfg.SlotSettings.PollInterval, func() error {
		rctx, cancel := context.WithTimeout(ctx, sampleTimeout)
		now, err := d.readRelations(rctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				d.log.Debug("cannot read the counters' tables", zap.Error(err))
			}
			return nil
		}
		for name, r := range now {
			// A rename away is followed by identity within the session
			// (the aggregator binds by OID); what matters is a name that
			// designates another relation, or a relation that entered or
			// left the publication.
			if r.oid != 0 && r != at[name] {
				return fmt.Errorf("%w: %s (oid %d, published %t; was oid %d, published %t)",
					errRelationsChanged, name, r.oid, r.published, at[name].oid, at[name].published)
			}
		}
		return nil
	})
}
