package preflight

import (
	"fmt"
	"slices"
	"strings"

	"github.com/walcount/walcount/counter"
)

// checkPublication checks that the publication exists, publishes every
// operation walcount needs (TRUNCATE included: it is a barrier, DESIGN §2
// rule 10) and includes every source table with all its rows and the
// columns the counters read.
func (r *run) checkPublication() error {
	pub := r.ident(r.cfg.Publication)

	// The source tables that exist, in order, without repeats.
	var sources []*table
	for _, c := range r.cfg.Counters {
		t, err := r.lookupTable(c.Source)
		if err != nil {
			return r.queryFailed(CheckPublication, "source table "+c.Source, err)
		}
		if t.Exists && !slices.Contains(sources, t) {
			sources = append(sources, t)
		}
	}
	names := make([]string, len(sources))
	for i, t := range sources {
		names[i] = t.sql
	}

	var ins, upd, del, trunc, viaRoot bool
	err := r.conn.QueryRow(r.ctx, `
SELECT pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot
FROM pg_publication WHERE pubname = $1`, r.cfg.Publication).Scan(&ins, &upd, &del, &trunc, &viaRoot)
	if errNoRows(err) {
		fix := "walcount setup"
		if len(names) > 0 {
			fix = fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s;", pub, strings.Join(names, ", "))
		}
		r.problem(CheckPublication, fmt.Sprintf("publication %s does not exist", r.cfg.Publication), fix)
		return nil
	}
	if err != nil {
		return r.queryFailed(CheckPublication, "publication "+r.cfg.Publication, err)
	}

	ok := true
	var ops []string
	for _, o := range []struct {
		on   bool
		name string
	}{{ins, "insert"}, {upd, "update"}, {del, "delete"}, {trunc, "truncate"}} {
		if !o.on {
			ops = append(ops, o.name)
		}
	}
	if len(ops) > 0 {
		ok = false
		r.problem(CheckPublication,
			fmt.Sprintf("publication %s does not publish %s: those changes would never be counted", r.cfg.Publication, strings.Join(ops, ", ")),
			fmt.Sprintf("ALTER PUBLICATION %s SET (publish = 'insert, update, delete, truncate');", pub))
	}

	// pg_publication_tables resolves FOR ALL TABLES and FOR TABLES IN
	// SCHEMA; from PostgreSQL 15 on it also shows column lists (attnames
	// lists every column when there is none) and row filters.
	published := map[string]pubTable{}
	query := `SELECT schemaname::text, tablename::text, NULL::text[], NULL::text FROM pg_publication_tables WHERE pubname = $1`
	if r.version.PublicationColumnLists() {
		query = `SELECT schemaname::text, tablename::text, attnames::text[], rowfilter FROM pg_publication_tables WHERE pubname = $1`
	}
	rows, err := r.conn.Query(r.ctx, query, r.cfg.Publication)
	if err != nil {
		return r.queryFailed(CheckPublication, "tables of publication "+r.cfg.Publication, err)
	}
	for rows.Next() {
		var schema, name string
		var p pubTable
		if err := rows.Scan(&schema, &name, &p.columns, &p.rowFilter); err != nil {
			rows.Close()
			return r.queryFailed(CheckPublication, "tables of publication "+r.cfg.Publication, err)
		}
		published[schema+"\x00"+name] = p
	}
	if err := rows.Err(); err != nil {
		return r.queryFailed(CheckPublication, "tables of publication "+r.cfg.Publication, err)
	}

	for _, t := range sources {
		if t.Kind == "p" && !viaRoot {
			// Without it pgoutput names each change by its partition,
			// which matches no counter.
			ok = false
			r.problem(CheckPublication,
				fmt.Sprintf("%s is partitioned but publication %s does not publish via the partition root", t.sql, r.cfg.Publication),
				fmt.Sprintf("ALTER PUBLICATION %s SET (publish_via_partition_root = true);", pub))
			continue
		}
		p, found := published[t.Schema+"\x00"+t.Name]
		if !found {
			ok = false
			r.problem(CheckPublication, fmt.Sprintf("publication %s does not include %s", r.cfg.Publication, t.sql),
				fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s;", pub, t.sql))
			continue
		}
		readd := fmt.Sprintf("ALTER PUBLICATION %[1]s DROP TABLE %[2]s; ALTER PUBLICATION %[1]s ADD TABLE %[2]s;", pub, t.sql)
		if p.rowFilter != nil {
			ok = false
			r.problem(CheckPublication,
				fmt.Sprintf("publication %s filters the rows of %s (WHERE %s): walcount must see every row; put filters in the counter's where", r.cfg.Publication, t.sql, *p.rowFilter),
				readd)
		}
		if p.columns != nil {
			var missing []string
			for _, col := range readColumns(r.cfg.Counters, t) {
				if !slices.Contains(p.columns, col) {
					missing = append(missing, r.ident(col))
				}
			}
			if len(missing) > 0 {
				ok = false
				r.problem(CheckPublication,
					fmt.Sprintf("publication %s leaves out column %s of %s", r.cfg.Publication, strings.Join(missing, ", "), t.sql),
					readd)
			}
		}
	}

	if ok {
		r.ok(CheckPublication, fmt.Sprintf("publication %s publishes insert, update, delete and truncate of %s", r.cfg.Publication, strings.Join(names, ", ")))
	}
	return nil
}

// pubTable is one row of pg_publication_tables.
type pubTable struct {
	columns   []string // nil before PostgreSQL 15
	rowFilter *string
}

// readColumns returns the source columns that the counters on t read.
func readColumns(counters []counter.Counter, t *table) []string {
	var cols []string
	add := func(c string) {
		if c != "" && !slices.Contains(cols, c) {
			cols = append(cols, c)
		}
	}
	for _, c := range counters {
		if s, n := counter.SplitTable(c.Source); s != t.Schema || n != t.Name {
			continue
		}
		for _, col := range c.ReadColumns() {
			add(col)
		}
	}
	return cols
}
