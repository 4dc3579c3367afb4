package daemon

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/state"
)

// partitionScanTimeout bounds the read of a new leaf created in the
// transaction that attached it (see state.RowsBeforeAttach).
const partitionScanTimeout = 30 * time.Second

// watchPartitions compares the leaf partitions of every partitioned source
// with those saved in walcount's state, every slot poll interval while
// this daemon streams. DETACH PARTITION, DROP of a partition, TRUNCATE of
// one partition (which pgoutput does not publish when the publication
// publishes through the root) and ATTACH of a table that has rows change
// a source's rows without a row-level change in the WAL; any of them marks
// the counter dirty, and the reconciler repairs it (design rule 14). It
// also follows the UNLOGGED leaves of every source, or a source that is
// itself unlogged (followUnlogged).
func (d *Daemon) watchPartitions(ctx context.Context) {
	_ = everyTick(ctx, d.cfg.SlotSettings.PollInterval, func() error {
		if !d.streaming() {
			return nil
		}
		for _, c := range d.cfg.Counters {
			if err := d.checkPartitions(ctx, c); err != nil && ctx.Err() == nil {
				d.log.Debug("cannot compare a source's partitions", zap.String("counter", c.Name), zap.Error(err))
			}
		}
		return nil
	})
}

// checkPartitions compares one counter's source with its saved leaves,
// marks the counter dirty when rows changed without WAL, and saves the
// leaves as they are now, in one transaction.
func (d *Daemon) checkPartitions(parent context.Context, c counter.Counter) error {
	ctx, cancel := context.WithTimeout(parent, sampleTimeout)
	defer cancel()
	schema, name := counter.SplitTable(c.Source)
	source := pgx.Identifier{schema, name}.Sanitize()
	now, partitioned, err := state.ReadLeaves(ctx, d.pool, source)
	if err != nil {
		return err
	}
	// PostgreSQL refuses SET UNLOGGED for a table named in a publication,
	// but not for a partition, nor for a table a FOR ALL TABLES
	// publication holds, which then leaves it.
	unlogged, err := counter.UnloggedParts(ctx, d.pool, source)
	if err != nil {
		return err
	}
	if err := d.followUnlogged(ctx, c, unlogged, partitioned); err != nil {
		return err
	}
	if !partitioned {
		return nil
	}
	saved, ok, err := state.SavedLeaves(ctx, d.pool, d.cfg.Slot, c.Name)
	if err != nil {
		return err
	}
	var changes []string
	if ok {
		var added []state.Leaf
		changes, added = state.LeafChanges(saved, now)
		for _, l := range added {
			if !l.Preexisting {
				// Created in the transaction that attached it: as a
				// partition (its rows came through the WAL), or apart,
				// filled and attached (they did not).
				// That reads the whole leaf, once: it gets a bound of
				// its own, and a leaf too large to read within it is
				// repaired rather than trusted.
				sctx, scancel := context.WithTimeout(parent, partitionScanTimeout)
				before, err := state.RowsBeforeAttach(sctx, d.pool, source, l)
				timedOut := sctx.Err() != nil && parent.Err() == nil
				scancel()
				switch {
				case err != nil && timedOut:
					changes = append(changes, fmt.Sprintf("partition %s created and attached in one transaction, too large to tell within %s whether it was filled before its attachment", l.Name, partitionScanTimeout))
				case err != nil:
					return err
				case before:
					changes = append(changes, fmt.Sprintf("partition %s created, filled and attached in one transaction", l.Name))
				}
				continue
			}
			var rows bool
			// The name is regclass's output: quoted where it needs to be.
			if err := d.pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+l.Name+")").Scan(&rows); err != nil {
				return fmt.Errorf("read partition %s: %w", l.Name, err)
			}
			if rows {
				changes = append(changes, fmt.Sprintf("partition %s attached with rows", l.Name))
			}
		}
		if len(changes) == 0 && len(added) == 0 {
			return nil
		}
	}
	// A long read of a new leaf may have used up the first bound.
	ctx, cancel = context.WithTimeout(parent, sampleTimeout)
	defer cancel()
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if len(changes) > 0 {
		if err := state.MarkDirty(ctx, tx, d.cfg.Slot, c.Name, nil, state.FormatLeafChanges(c.Source, changes)); err != nil {
			return err
		}
	}
	if err := state.SaveLeaves(ctx, tx, d.cfg.Slot, c.Name, now); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	if len(changes) > 0 {
		d.log.Warn("a source's partitions changed without row-level changes in the WAL; the counter is marked dirty and will be reconciled",
			zap.String("counter", c.Name), zap.Strings("changes", changes))
	}
	return nil
}

// followUnlogged follows the UNLOGGED leaves of a counter's source (or the
// source itself, not partitioned): their changes are not in the WAL, so
// while there is one the counter is
// degraded (its repair waits, since every later write to the leaf would
// undo it) and dirty, with the fix as the cause. Once no leaf is unlogged
// (ALTER TABLE ... SET LOGGED, which rewrites the leaf, or the leaf
// detached or dropped), the counter is keepable again and the reconciler
// repairs it (docs/design.md, "Unlogged tables").
func (d *Daemon) followUnlogged(ctx context.Context, c counter.Counter, names []string, partitioned bool) error {
	d.mu.Lock()
	was := d.state.unlogged[c.Name]
	if d.state.unlogged == nil {
		d.state.unlogged = map[string][]string{}
	}
	d.state.unlogged[c.Name] = names
	d.mu.Unlock()
	switch {
	case slices.Equal(was, names):
		return nil
	case len(names) == 0:
		d.log.Info("no partition of the source is unlogged any more; the counter will be reconciled",
			zap.String("counter", c.Name), zap.Strings("were_unlogged", was))
		return nil
	case len(was) > 0:
		// Dirty already, and stays so until none is unlogged.
		d.log.Warn("partitions of a source are UNLOGGED: their changes are not in the WAL", zap.String("counter", c.Name),
			zap.Strings("unlogged", names), zap.String("fix", counter.SetLoggedFix(names)))
		return nil
	}
	cause := fmt.Sprintf("%s has UNLOGGED partitions (%s): their changes are not in the WAL, so walcount cannot count them; fix: %s",
		c.Source, strings.Join(names, ", "), counter.SetLoggedFix(names))
	if !partitioned {
		cause = fmt.Sprintf("%s is UNLOGGED: its changes are not in the WAL, so walcount cannot count them; fix: %s", c.Source, counter.SetLoggedFix(names))
	}
	if err := state.MarkDirty(ctx, d.pool, d.cfg.Slot, c.Name, nil, cause); err != nil {
		// Seen again at the next poll.
		d.mu.Lock()
		d.state.unlogged[c.Name] = was
		d.mu.Unlock()
		return err
	}
	d.log.Warn("partitions of a source are UNLOGGED: their changes are not in the WAL; the counter is degraded and dirty until they are logged",
		zap.String("counter", c.Name), zap.Strings("unlogged", names), zap.String("fix", counter.SetLoggedFix(names)))
	return nil
}
