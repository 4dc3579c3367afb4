package aggregator

import (
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
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
	key     int // column index of the key, -1 for a total with no key
	// constKey is the one key of a total with no key (TargetRow).
	constKey []byte
	// appendOnly: the source is declared to take only inserts; its
	// updates and deletes are not counted but mark the counter dirty.
	appendOnly bool
	sum        int // column index of the summed column, or -1
	// scale is the declared scale of the summed column: its values are
	// counted in units of 10^-scale (0 for integer columns).
	scale int
	// boolSum is set for a summed boolean: true counts +1, false -1.
	boolSum bool
	// derive computes a generated summed column from the columns inputs
	// names (their indexes); sum is then -1.
	derive *counter.Derivation
	inputs map[string]int
	// ext is the column index of an extremum's max or min column, or -1:
	// a change of the key's rows is counted as a recompute (+1), not as
	// an amount.
	ext   int
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
	col  int
	cond counter.Cond // values in pgoutput's text form
}

// contribution is what one row adds to a counter.
type contribution struct {
	ok     bool
	key    []byte
	amount int64
	// val is an extremum's value (nil when NULL: it counts nowhere).
	val []byte
}

// bindRules binds the counters whose source is rel to rel's columns. It
// fails with ErrNotAttributable when a needed column is missing (dropped or
// renamed while walcount streams), and with counter.ErrUnsupportedSum when
// the summed column has no exact scale. A rule whose columns the replica
// identity does not carry is bound degraded: old rows could not be
// attributed (design rules 11 and 14).
func bindRules(rel *cdc.Relation, counters []counter.Counter, rels Relations, derived map[string]*counter.Derivation) ([]rule, error) {
	var out []rule
	for _, c := range counters {
		if !rels.Is(c.Source, rel) {
			continue
		}
		r := rule{counter: c.Name, key: -1, sum: -1, ext: -1}
		if c.Keyless() {
			// A total with no key: every row counts into the one key,
			// which walcount check makes sure is written in the text
			// form pgoutput sends the target key in.
			r.constKey = []byte(c.TargetRow)
		} else {
			if r.key = rel.ColumnIndex(c.Key); r.key < 0 {
				return nil, fmt.Errorf("counter %s: %w: key column %q is not in %s", c.Name, ErrNotAttributable, c.Key, rel.QualifiedName())
			}
			r.cols = append(r.cols, r.key)
		}
		if d := derived[c.Name]; c.Sum != "" && d != nil && rel.ColumnIndex(c.Sum) < 0 {
			// A generated column the stream does not carry: computed
			// from its inputs, which are integers or booleans.
			r.derive = d
			r.inputs = map[string]int{}
			for _, in := range d.Inputs() {
				i := rel.ColumnIndex(in)
				if i < 0 {
					return nil, fmt.Errorf("counter %s: %w: column %q, from which the summed column %q is derived, is not in %s", c.Name, ErrNotAttributable, in, c.Sum, rel.QualifiedName())
				}
				r.inputs[in] = i
				r.cols = append(r.cols, i)
			}
		} else if c.Sum != "" {
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
			r.boolSum = rel.Columns[r.sum].TypeOID == pgtype.BoolOID
		}
		if v, fn := c.Extremum(); v != "" {
			if r.ext = rel.ColumnIndex(v); r.ext < 0 {
				return nil, fmt.Errorf("counter %s: %w: %s column %q is not in %s", c.Name, ErrNotAttributable, fn, v, rel.QualifiedName())
			}
			r.cols = append(r.cols, r.ext)
		}
		for _, cd := range c.Conds() {
			i := rel.ColumnIndex(cd.Column)
			if i < 0 {
				return nil, fmt.Errorf("counter %s: %w: where column %q is not in %s", c.Name, ErrNotAttributable, cd.Column, rel.QualifiedName())
			}
			for j, v := range cd.Values {
				cd.Values[j] = *counter.CanonicalValue(rel.Columns[i].TypeOID, &v)
			}
			r.where = append(r.where, filter{col: i, cond: cd})
			r.cols = append(r.cols, i)
		}
		r.appendOnly = c.AppendOnly
		if rel.ReplicaIdentity != 'f' && !r.appendOnly {
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
		if !f.cond.Matches(v.Kind == cdc.ValueNull, string(v.Data)) {
			return contribution{}, nil
		}
	}
	c := contribution{ok: true, key: r.constKey, amount: 1}
	if r.key >= 0 {
		k, err := value(t, alt, r.key)
		if err != nil {
			return contribution{}, err
		}
		if k.Kind == cdc.ValueNull {
			return contribution{}, nil // a row with no target counts nowhere
		}
		c.key = k.Data
	}
	if r.ext >= 0 {
		v, err := value(t, alt, r.ext)
		if err != nil {
			return contribution{}, err
		}
		if v.Kind == cdc.ValueNull {
			return contribution{}, nil // max and min ignore NULLs
		}
		c.val = v.Data
		return c, nil
	}
	if r.derive != nil {
		v, null, err := r.derive.Eval(func(col string) ([]byte, bool, error) {
			v, err := value(t, alt, r.inputs[col])
			return v.Data, v.Kind == cdc.ValueNull, err
		})
		if err != nil {
			return contribution{}, err
		}
		if null {
			v = 0
		}
		c.amount = v
	}
	if r.sum >= 0 {
		s, err := value(t, alt, r.sum)
		if err != nil {
			return contribution{}, err
		}
		switch {
		case s.Kind == cdc.ValueNull:
			c.amount = 0
		case r.boolSum:
			switch string(s.Data) {
			case "t":
				c.amount = 1
			case "f":
				c.amount = -1
			default:
				return contribution{}, fmt.Errorf("%w: %q is not a boolean", counter.ErrBadValue, s.Data)
			}
		default:
			if c.amount, err = counter.ParseScaled(s.Data, r.scale); err != nil {
				return contribution{}, err
			}
		}
	}
	return c, nil
}
