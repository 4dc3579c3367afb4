package daemon

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/walcount/walcount/internal/testkit/appschema"
	"github.com/walcount/walcount/state"
)

// partitionedSchema is schema with likes partitioned by post.
var partitionedSchema = appschema.SQL(appschema.Options{
	LikesColumns: likedBy + ", PRIMARY KEY (id, post_id)", PartitionBy: "RANGE (post_id)", Posts: 50}) + `
CREATE TABLE likes_a PARTITION OF likes FOR VALUES FROM (1) TO (18);
CREATE TABLE likes_b PARTITION OF likes FOR VALUES FROM (18) TO (35);
CREATE TABLE likes_c PARTITION OF likes FOR VALUES FROM (35) TO (52);
ALTER TABLE likes_a REPLICA IDENTITY FULL;
ALTER TABLE likes_b REPLICA IDENTITY FULL;
ALTER TABLE likes_c REPLICA IDENTITY FULL;
` + eventsTable

// waitLeafSaved waits until the partition watcher has saved leaf among the
// default counter's leaves: it has compared the partitions since leaf
// came, and marked the counter dirty in that transaction if it was to.
// Nothing marked is then a decision, not a mark that is yet to come.
func (e *env) waitLeafSaved(t *testing.T, leaf string) {
	t.Helper()
	ctx := context.Background()
	var oid uint32
	if err := e.db.QueryRow(ctx, "SELECT $1::regclass::oid", leaf).Scan(&oid); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the partition watcher to save "+leaf, func() bool {
		saved, _, err := state.SavedLeaves(ctx, e.db, e.cfg.Slot, e.cfg.Counters[0].Name)
		return err == nil && slices.ContainsFunc(saved, func(l state.Leaf) bool { return l.OID == oid })
	})
}

// TestPartitionedSource counts a partitioned likes under churn through
// DDL that changes its rows without row-level changes in the WAL: TRUNCATE
// of one partition, DETACH, ATTACH of a table with rows, DROP of a
// partition, and a TRUNCATE of the whole table. After each, the counts are
// exact again with no command typed: walcount sees the partitions change,
// marks the counter dirty and reconciles it.
func TestPartitionedSource(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, partitionedSchema, nil)
	ctx := context.Background()
	d := e.start()
	waitRun(t, d, 0)
	w := newWorkload(e.db)
	w.run(ctx, 2, 100)
	e.waitCaughtUp(catchUp)
	e.assertExact()

	steps := []struct {
		name string
		ddl  []string
	}{
		{"truncate one partition", []string{"TRUNCATE likes_a"}},
		{"detach a partition", []string{"ALTER TABLE likes DETACH PARTITION likes_b"}},
		{"attach a table with rows", []string{"ALTER TABLE likes ATTACH PARTITION likes_b FOR VALUES FROM (18) TO (35)"}},
		// Faster than a poll: the partition set looks the same after.
		{"detach, write, attach again", []string{
			"ALTER TABLE likes DETACH PARTITION likes_a",
			"INSERT INTO likes_a (post_id) SELECT 1 + g % 17 FROM generate_series(1, 40) g",
			"ALTER TABLE likes ATTACH PARTITION likes_a FOR VALUES FROM (1) TO (18)",
		}},
		{"drop a partition", []string{"DROP TABLE likes_c"}},
		{"create an empty partition", []string{
			"CREATE TABLE likes_c PARTITION OF likes FOR VALUES FROM (35) TO (52)",
			"ALTER TABLE likes_c REPLICA IDENTITY FULL",
		}},
		{"truncate the whole table", []string{"TRUNCATE likes"}},
	}
	for _, s := range steps {
		stop := w.background(2, 10)
		w.waitCommitted(t, 30)
		if s.name == "drop a partition" || s.name == "detach a partition" {
			// likes_c must hold rows when it goes.
			e.exec("INSERT INTO likes (post_id) SELECT 35 + g % 15 FROM generate_series(1, 30) g")
		}
		var before int
		if err := e.db.QueryRow(ctx, "SELECT count(*) FROM walcount.reconcile_runs WHERE kind = 'dirty' AND status = 'done'").Scan(&before); err != nil {
			t.Fatal(err)
		}
		for _, ddl := range s.ddl {
			e.exec(ddl)
		}
		marked := time.Now()
		w.waitOps(t, 30)
		stop()
		if s.name == "create an empty partition" {
			// No rows bypassed the WAL: nothing to repair.
			e.waitCaughtUp(catchUp)
			e.waitLeafSaved(t, "likes_c")
			marks, err := state.ListDirty(ctx, e.db, e.cfg.Slot)
			if err != nil {
				t.Fatal(err)
			}
			if len(marks) != 0 {
				t.Errorf("%s: marked dirty: %+v", s.name, marks)
			}
			e.assertExact()
			continue
		}
		waitFor(t, s.name+": a repair", func() bool {
			var done int
			_ = e.db.QueryRow(ctx, "SELECT count(*) FROM walcount.reconcile_runs WHERE kind = 'dirty' AND status = 'done'").Scan(&done)
			marks, err := state.ListDirty(ctx, e.db, e.cfg.Slot)
			return err == nil && len(marks) == 0 && done > before
		})
		e.waitCaughtUp(catchUp)
		t.Logf("%s: repaired %s after the DDL", s.name, time.Since(marked).Round(time.Millisecond))
		e.assertExact()
	}
	w.report(t)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestUnloggedPartitionAttached: an UNLOGGED table attached as a partition
// of likes while walcount streams, and written to: none of its rows is in
// the WAL. walcount must not miss that silently: the counter is reported
// degraded and dirty, and is not repaired while the partition stays
// unlogged (each later write would undo the repair). Once the partition is
// SET LOGGED, the counter is repaired by itself and exact again.
func TestUnloggedPartitionAttached(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, partitionedSchema+`
INSERT INTO posts (id) SELECT g FROM generate_series(52, 59) g;
CREATE UNLOGGED TABLE likes_u (LIKE likes);
ALTER TABLE likes_u REPLICA IDENTITY FULL;
`, nil)
	ctx := context.Background()
	d := e.start()
	waitRun(t, d, 0)
	w := newWorkload(e.db)
	w.run(ctx, 2, 50)
	e.waitCaughtUp(catchUp)
	e.assertExact()

	e.exec("ALTER TABLE likes ATTACH PARTITION likes_u FOR VALUES FROM (52) TO (60)")
	e.exec("INSERT INTO likes (post_id) SELECT 52 + g % 8 FROM generate_series(1, 40) g")
	waitFor(t, "the counter reported degraded and dirty", func() bool {
		st := d.d.Status(ctx)
		for _, m := range st.Dirty {
			if strings.Contains(m.Cause, "UNLOGGED") && strings.Contains(m.Cause, "ALTER TABLE public.likes_u SET LOGGED;") {
				return len(st.Degraded) == 1 && st.Degraded[0] == "post_likes"
			}
		}
		return false
	})
	w.run(ctx, 2, 50)
	e.exec("INSERT INTO likes (post_id) SELECT 52 + g % 8 FROM generate_series(1, 40) g")
	e.waitCaughtUp(catchUp)
	cached, truth := e.count(t, 52)
	if cached == truth {
		t.Fatalf("post 52: likes_count %d equals COUNT(*) although its likes are in an unlogged partition: the test shows nothing", cached)
	}
	var repairs int
	if err := e.db.QueryRow(ctx, "SELECT count(*) FROM walcount.reconcile_runs WHERE kind = 'dirty'").Scan(&repairs); err != nil {
		t.Fatal(err)
	}
	if repairs != 0 {
		t.Errorf("%d repairs started while the partition is unlogged", repairs)
	}

	e.exec("ALTER TABLE likes_u SET LOGGED")
	w.run(ctx, 2, 50)
	e.exec("INSERT INTO likes (post_id) SELECT 52 + g % 8 FROM generate_series(1, 40) g")
	e.waitClean(t, 2*time.Minute)
	if got := d.d.Status(ctx).Degraded; len(got) != 0 {
		t.Errorf("still degraded after SET LOGGED: %v", got)
	}
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestUnloggedSourceUnderAllTables: with a FOR ALL TABLES publication,
// PostgreSQL lets ALTER TABLE likes SET UNLOGGED through, and likes then
// silently leaves the publication. walcount reports the counter degraded
// and dirty, and repairs it once likes is logged again.
func TestUnloggedSourceUnderAllTables(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.exec("DROP PUBLICATION " + e.cfg.Publication)
	e.exec("CREATE PUBLICATION " + e.cfg.Publication + " FOR ALL TABLES")
	ctx := context.Background()
	d := e.start()
	waitRun(t, d, 0)
	w := newWorkload(e.db)
	w.run(ctx, 2, 50)
	e.waitCaughtUp(catchUp)
	e.assertExact()

	e.exec("ALTER TABLE likes SET UNLOGGED")
	e.exec("INSERT INTO likes (post_id) SELECT 1 + g % 50 FROM generate_series(1, 100) g")
	waitFor(t, "the counter reported degraded and dirty", func() bool {
		st := d.d.Status(ctx)
		for _, m := range st.Dirty {
			if strings.Contains(m.Cause, "public.likes is UNLOGGED") && strings.Contains(m.Cause, "ALTER TABLE public.likes SET LOGGED;") {
				return len(st.Degraded) == 1
			}
		}
		return false
	})
	e.exec("ALTER TABLE likes SET LOGGED")
	w.run(ctx, 2, 50)
	e.waitClean(t, 2*time.Minute)
	if got := d.d.Status(ctx).Degraded; len(got) != 0 {
		t.Errorf("still degraded after SET LOGGED: %v", got)
	}
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestPartitionFilledAndAttachedInOneTransaction creates a table, fills
// it and attaches it as a partition of the source in one transaction: its
// rows were inserted while it was not yet part of the source, so they never
// reach the stream, and the attachment looks like a partition created as
// such (one transaction wrote its catalog rows). walcount must see in the
// catalog that rows predate the attachment, mark the counter dirty and
// repair it. A partition created as such and filled in the same
// transaction, whose rows did reach the stream, marks nothing.
func TestPartitionFilledAndAttachedInOneTransaction(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, partitionedSchema+"INSERT INTO posts (id) SELECT g FROM generate_series(52, 70) g;\n", nil)
	ctx := context.Background()
	d := e.start()
	waitRun(t, d, 0)
	newWorkload(e.db).run(ctx, 2, 50)
	e.waitCaughtUp(catchUp)
	e.assertExact()
	dirtyRunsDone := func() int {
		var n int
		if err := e.db.QueryRow(ctx, "SELECT count(*) FROM walcount.reconcile_runs WHERE kind = 'dirty' AND status = 'done'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Created as a partition and filled in one transaction: the rows are
	// in the stream.
	e.inTransaction(
		"CREATE TABLE likes_d PARTITION OF likes FOR VALUES FROM (52) TO (61)",
		"ALTER TABLE likes_d REPLICA IDENTITY FULL",
		"INSERT INTO likes (post_id) SELECT 52 + g % 9 FROM generate_series(1, 300) g",
	)
	e.waitCaughtUp(catchUp)
	e.waitLeafSaved(t, "likes_d")
	if marks, err := state.ListDirty(ctx, e.db, e.cfg.Slot); err != nil || len(marks) != 0 {
		t.Errorf("a partition created as such and filled in its transaction marked the counter dirty: %+v (%v)", marks, err)
	}
	e.assertExact()
	before := dirtyRunsDone()

	// Created apart, filled and attached in one transaction: 600 rows
	// the stream never carries.
	e.inTransaction(
		"CREATE TABLE likes_e (id bigint NOT NULL DEFAULT nextval('likes_id_seq'), post_id bigint NOT NULL, user_id bigint NOT NULL DEFAULT 0, PRIMARY KEY (id, post_id))",
		"INSERT INTO likes_e (post_id) SELECT 61 + g % 10 FROM generate_series(1, 600) g",
		"ALTER TABLE likes_e REPLICA IDENTITY FULL",
		"ALTER TABLE likes ATTACH PARTITION likes_e FOR VALUES FROM (61) TO (71)",
	)
	waitFor(t, "the rows attached in one transaction to be repaired", func() bool {
		marks, err := state.ListDirty(ctx, e.db, e.cfg.Slot)
		return err == nil && len(marks) == 0 && dirtyRunsDone() > before
	})
	e.waitCaughtUp(catchUp)
	e.assertExact()
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}
