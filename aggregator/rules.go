package aggregator

import (
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/operator"
)

// ErrNotAttributable is wrapped when a change lacks a column a counter
// needs: the replica identity does not carry it, or it arrived as an
// unchanged TOASTed value with no old value to stand in for it.
var ErrNotAttributable = operator.NewError("change cannot be attributed to a counter key")

// rule is a counter bound to one version of its source relation.
type rule struct {
	counter string
	key     int // column index of the key
	sum     int // column index of the summed column, or -1
	// scale is the declared scale of the summed column: its values are
	// counted in units of 10^-scale (0 for integer columns).
	scale int
	where []filter
	// cols lists every column the rule reads, for identity checks.
	cols []int
	// degraded is set when the replica identity lacks a column the rule
	// reads: old rows cannot be attributed, so only inserts are counted
	// and the counter is dirty until the identity is back (why says
	// which column).
	degraded bool
	why      string
	// changed counts changes per operation (walcount_changes_total);
	// tallied is the same count in the daemon's Tally, for /status.
	changed [4]prometheus.Counter
	tallied [4]*atomic.Int64
}

type filter struct {
	col   int
	value *string // nil: IS NULL
}

// contribution is what one row adds to a counter.
type contribution struct {
	ok     bool
	key    []byte
	amount int64
}

// bindRules binds the counters whose source is rel to rel's columns. It
// fails with ErrNotAttributable when a needed column is missing (dropped or
// renamed while walcount streams), and with counter.ErrUnsupportedSum when
// the summed column has no exact scale. A rule whose columns the replica
// identity does not carry is bound degraded: old rows could not be
// attributed (design rules 11 and 14).
func bindRules(rel *cdc.Relation, counters []counter.Counter, rels Relations) ([]rule, error) {
	var out []rule
	for _, c := range counters {
		if !rels.Is(c.Source, rel) {
			continue
		}
		r := rule{counter: c.Name, key: rel.ColumnIndex(c.Key), sum: -1}
		if r.key < 0 {
			return nil, fmt.Errorf("counter %s: %w: key column %q is not in %s", c.Name, ErrNotAttributable, c.Key, rel.QualifiedName())
		}
		r.cols = append(r.cols, r.key)
		if c.Sum != "" {
			if r.sum = rel.ColumnIndex(c.Sum); r.sum < 0 {
				return nil, fmt.Errorf("counter %s: %w: sum column %q is not in %s", c.Name, ErrNotAttributable, c.Sum, rel.QualifiedName())
			}
			r.cols = append(r.cols, r.sum)
			scale, err := counter.SumScale(rel.Columns[r.sum].TypeOID, rel.Columns[r.sum].TypMod)
			if err != nil {
				return nil, fmt.Errorf("counter %s: sum column %q of %s: %w; run: ALTER TABLE %s ALTER COLUMN %s TYPE numeric(12,2) (with the scale your values need)",
					c.Name, c.Sum, rel.QualifiedName(), err, rel.QualifiedName(), pgx.Identifier{c.Sum}.Sanitize())
			}
			r.scale = scale
		}
		for col, v := range c.Where {
			i := rel.ColumnIndex(col)
			if i < 0 {
				return nil, fmt.Errorf("counter %s: %w: where column %q is not in %s", c.Name, ErrNotAttributable, col, rel.QualifiedName())
			}
			r.where = append(r.where, filter{col: i, value: counter.CanonicalValue(rel.Columns[i].TypeOID, v)})
			r.cols = append(r.cols, i)
		}
		if rel.ReplicaIdentity != 'f' {
			for _, i := range r.cols {
				if !rel.Columns[i].Key {
					r.degraded = true
					r.why = fmt.Sprintf("column %q of %s is not in its replica identity: its updates and deletes cannot be attributed (fix: ALTER TABLE %s REPLICA IDENTITY FULL)",
						rel.Columns[i].Name, rel.QualifiedName(), rel.QualifiedName())
					break
				}
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// Relations binds table names (canonical, as counters name them) to the
// OIDs of the relations they named when the session started: a relation
// keeps its OID through a rename, and the stream names each change by it
// (design rule 17). A name without an OID is matched by name.
type Relations map[string]uint32

// Is reports whether rel is the relation name is bound to.
func (r Relations) Is(name string, rel *cdc.Relation) bool {
	if oid, ok := r[name]; ok && oid != 0 {
		return rel.ID == oid
	}
	schema, table := counter.SplitTable(name)
	return schema == rel.Namespace && table == rel.Name
}

// value returns column i of t, standing in the same column of alt for an
// unchanged TOASTed value (the value did not change, so alt has it).
func value(t, alt cdc.Tuple, i int) (cdc.Value, error) {
	if i >= len(t.Cols) {
		return cdc.Value{}, fmt.Errorf("%w: tuple has %d columns, need %d", ErrNotAttributable, len(t.Cols), i+1)
	}
	v := t.Cols[i]
	if v.Kind == cdc.ValueUnchangedToast {
		if i < len(alt.Cols) && alt.Cols[i].Kind != cdc.ValueUnchangedToast {
			return alt.Cols[i], nil
		}
		return v, fmt.Errorf("%w: column %d is an unchanged TOASTed value", ErrNotAttributable, i+1)
	}
	return v, nil
}

// contribute computes what row t contributes to r. alt is the other image
// of the same row (old for new and vice versa), used for unchanged TOASTed
// values.
func (r *rule) contribute(t, alt cdc.Tuple) (contribution, error) {
	if !t.Present() {
		return contribution{}, nil
	}
	for _, f := range r.where {
		v, err := value(t, alt, f.col)
		if err != nil {
			return contribution{}, err
		}
		if f.value == nil {
			if v.Kind != cdc.ValueNull {
				return contribution{}, nil
			}
		} else if v.Kind != cdc.ValueText || string(v.Data) != *f.value {
			return contribution{}, nil
		}
	}
	k, err := value(t, alt, r.key)
	if err != nil {
		return contribution{}, err
	}
	if k.Kind == cdc.ValueNull {
		return contribution{}, nil // a row with no target counts nowhere
	}
	c := contribution{ok: true, key: k.Data, amount: 1}
	if r.sum >= 0 {
		s, err := value(t, alt, r.sum)
		if err != nil {
			return contribution{}, err
		}
		if s.Kind == cdc.ValueNull {
			c.amount = 0
		} else if c.amount, err = counter.ParseScaled(s.Data, r.scale); err != nil {
			return contribution{}, err
		}
	}
	return c, nil
}
