package state

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// Leaf is one leaf partition of a partitioned source table.
type Leaf struct {
	OID  uint32
	Name string // schema-qualified, as regclass prints it
	// FileNode is the leaf's relfilenode: TRUNCATE (and a rewrite such as
	// VACUUM FULL) gives it a new one.
	FileNode uint32
	// Attached identifies the attachment of the leaf and of each of its
	// ancestors below the source: the xmins of their pg_inherits rows,
	// which a DETACH followed by an ATTACH replaces.
	Attached string
	// Preexisting is true when the leaf, or one of its ancestors below
	// the source, was attached after it was created (ATTACH PARTITION of
	// an existing table, whose rows never passed through the source in
	// the WAL) rather than created as a partition (CREATE TABLE ...
	// PARTITION OF, whose rows all did). Not saved.
	Preexisting bool
}

// ReadLeaves returns the leaf partitions of table (schema.table) now, in
// OID order, and whether it is partitioned at all. A leaf without storage
// (a partitioned table with no partitions yet) has FileNode 0.
func ReadLeaves(ctx context.Context, q Querier, table string) (leaves []Leaf, partitioned bool, err error) {
	if err := q.QueryRow(ctx, `SELECT c.relkind = 'p' FROM pg_class c WHERE c.oid = to_regclass($1)`, table).Scan(&partitioned); err != nil {
		return nil, false, fmt.Errorf("read the kind of %s: %w", table, err)
	}
	if !partitioned {
		return nil, false, nil
	}
	// A table created as a partition has its row type and its pg_inherits
	// row from one transaction; an attached one has an older row type.
	rows, err := q.Query(ctx, `
SELECT t.relid::oid, t.relid::regclass::text, c.relfilenode,
       string_agg(i.xmin::text, ',' ORDER BY a.level),
       coalesce(bool_or(i.xmin <> ty.xmin), false)
FROM pg_partition_tree(to_regclass($1)) t
JOIN pg_class c ON c.oid = t.relid
JOIN pg_partition_tree(to_regclass($1)) a ON a.relid IN (SELECT pg_partition_ancestors(t.relid)) AND a.level > 0
JOIN pg_inherits i ON i.inhrelid = a.relid
JOIN pg_class ac ON ac.oid = a.relid
JOIN pg_type ty ON ty.oid = ac.reltype
WHERE t.isleaf AND c.relkind <> 'p'
GROUP BY t.relid, c.relfilenode
ORDER BY 1`, table)
	if err != nil {
		return nil, true, fmt.Errorf("read the partitions of %s: %w", table, err)
	}
	defer rows.Close()
	for rows.Next() {
		var l Leaf
		if err := rows.Scan(&l.OID, &l.Name, &l.FileNode, &l.Attached, &l.Preexisting); err != nil {
			return nil, true, fmt.Errorf("read the partitions of %s: %w", table, err)
		}
		leaves = append(leaves, l)
	}
	if err := rows.Err(); err != nil {
		return nil, true, fmt.Errorf("read the partitions of %s: %w", table, err)
	}
	return leaves, true, nil
}

// SavedLeaves returns the leaves last saved for a counter of slot, and
// whether they were saved at all (a source with no leaf is saved as a
// row for leaf 0).
func SavedLeaves(ctx context.Context, q Querier, slot, counter string) ([]Leaf, bool, error) {
	rows, err := q.Query(ctx, `SELECT leaf, name, relfilenode, attached FROM walcount.partitions WHERE slot_name = $1 AND counter = $2 ORDER BY leaf`, slot, counter)
	saved := false
	if err != nil {
		return nil, false, fmt.Errorf("read the saved partitions of counter %s: %w", counter, err)
	}
	defer rows.Close()
	var leaves []Leaf
	for rows.Next() {
		var l Leaf
		if err := rows.Scan(&l.OID, &l.Name, &l.FileNode, &l.Attached); err != nil {
			return nil, false, fmt.Errorf("read the saved partitions of counter %s: %w", counter, err)
		}
		saved = true
		if l.OID != 0 {
			leaves = append(leaves, l)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("read the saved partitions of counter %s: %w", counter, err)
	}
	return leaves, saved, nil
}

// SaveLeaves replaces the leaves saved for a counter of slot.
func SaveLeaves(ctx context.Context, q Querier, slot, counter string, leaves []Leaf) error {
	if _, err := q.Exec(ctx, `DELETE FROM walcount.partitions WHERE slot_name = $1 AND counter = $2`, slot, counter); err != nil {
		return fmt.Errorf("save the partitions of counter %s: %w", counter, err)
	}
	for _, l := range append([]Leaf{{}}, leaves...) {
		if _, err := q.Exec(ctx, `INSERT INTO walcount.partitions (slot_name, counter, leaf, name, relfilenode, attached) VALUES ($1, $2, $3, $4, $5, $6)`,
			slot, counter, l.OID, l.Name, l.FileNode, l.Attached); err != nil {
			return fmt.Errorf("save the partitions of counter %s: %w", counter, err)
		}
	}
	return nil
}

// LeafChanges compares the leaves saved with those now. It returns what
// changed rows without row-level changes in the WAL (a leaf detached or
// dropped, detached and attached again, truncated or rewritten), and the
// leaves added since. Of those, a leaf created as a partition (CREATE
// TABLE ... PARTITION OF) got its rows through the WAL; one attached
// (Preexisting) did not if it had rows, which only the caller can look at.
func LeafChanges(saved, now []Leaf) (changes []string, added []Leaf) {
	for _, o := range saved {
		i := slices.IndexFunc(now, func(n Leaf) bool { return n.OID == o.OID })
		switch {
		case i < 0:
			changes = append(changes, fmt.Sprintf("partition %s detached or dropped", o.Name))
		case now[i].Attached != o.Attached:
			changes = append(changes, fmt.Sprintf("partition %s detached and attached again", now[i].Name))
		case now[i].FileNode != o.FileNode:
			changes = append(changes, fmt.Sprintf("partition %s truncated or rewritten", now[i].Name))
		}
	}
	for _, n := range now {
		if !slices.ContainsFunc(saved, func(o Leaf) bool { return o.OID == n.OID }) {
			added = append(added, n)
		}
	}
	return changes, added
}

// FormatLeafChanges joins LeafChanges into one cause for a dirty mark.
func FormatLeafChanges(source string, changes []string) string {
	return fmt.Sprintf("%s changed without row-level changes in the WAL: %s", source, strings.Join(changes, ", "))
}

// RowsBeforeAttach reports whether leaf, created in the transaction that
// attached it below source (not Preexisting), holds rows that transaction
// wrote before the attachment: a table created apart, filled and attached
// in one transaction, whose rows were inserted while it was not part of the
// source and so never reached the stream. A partition created as such
// (CREATE TABLE ... PARTITION OF) has its pg_inherits row from its first
// command, so every row of its transaction comes after it. The order is
// the rows' and the pg_inherits rows' command ids (cmin) within that
// transaction (xmin), for the leaf and each of its ancestors below source.
func RowsBeforeAttach(ctx context.Context, q Querier, source string, leaf Leaf) (bool, error) {
	var before bool
	// The name is regclass's output: quoted where it needs to be. cid has
	// no ordering operator: its text is a whole number.
	err := q.QueryRow(ctx, `
SELECT EXISTS (
  SELECT FROM `+leaf.Name+` r
  JOIN pg_inherits i ON i.xmin = r.xmin AND r.cmin::text::bigint < i.cmin::text::bigint
  WHERE i.inhrelid IN (
    SELECT a.relid FROM pg_partition_tree(to_regclass($1)) a
    WHERE a.level > 0 AND a.relid IN (SELECT pg_partition_ancestors($2::oid::regclass))))`,
		source, leaf.OID).Scan(&before)
	if err != nil {
		return false, fmt.Errorf("read the rows of partition %s: %w", leaf.Name, err)
	}
	return before, nil
}
