package aggregator

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/internal/config"
)

var (
	// ErrNotAttributable is wrapped when a change lacks a column a counter
	// needs: the replica identity does not carry it, or it arrived as an
	// unchanged TOASTed value with no old value to stand in for it.
	ErrNotAttributable = errors.New("change cannot be attributed to a counter key")
	// ErrBadValue is wrapped when a summed column does not parse.
	ErrBadValue = errors.New("bad column value")
)

// rule is a counter bound to one version of its source relation.
type rule struct {
	counter string
	key     int // column index of the key
	sum     int // column index of the summed column, or -1
	where   []filter
	// cols lists every column the rule reads, for identity checks.
	cols []int
	// changed counts changes per operation (walcount_changes_total).
	changed [4]prometheus.Counter
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
// fails when a needed column is missing, or when the replica identity does
// not carry it and old rows could therefore not be attributed (DESIGN §2
// rule 11).
func bindRules(rel *cdc.Relation, counters []config.Counter) ([]rule, error) {
	var out []rule
	for _, c := range counters {
		if !sourceIs(c, rel) {
			continue
		}
		r := rule{counter: c.Name, key: rel.ColumnIndex(c.Key), sum: -1}
		if r.key < 0 {
			return nil, fmt.Errorf("counter %s: column %q not in %s", c.Name, c.Key, rel.QualifiedName())
		}
		r.cols = append(r.cols, r.key)
		if c.Sum != "" {
			if r.sum = rel.ColumnIndex(c.Sum); r.sum < 0 {
				return nil, fmt.Errorf("counter %s: sum column %q not in %s", c.Name, c.Sum, rel.QualifiedName())
			}
			r.cols = append(r.cols, r.sum)
		}
		for col, v := range c.Where {
			i := rel.ColumnIndex(col)
			if i < 0 {
				return nil, fmt.Errorf("counter %s: where column %q not in %s", c.Name, col, rel.QualifiedName())
			}
			r.where = append(r.where, filter{col: i, value: canonicalValue(rel.Columns[i].TypeOID, v)})
			r.cols = append(r.cols, i)
		}
		if rel.ReplicaIdentity != 'f' {
			for _, i := range r.cols {
				if !rel.Columns[i].Key {
					return nil, fmt.Errorf("counter %s: %w: column %q of %s is not in its replica identity; run: ALTER TABLE %s REPLICA IDENTITY FULL",
						c.Name, ErrNotAttributable, rel.Columns[i].Name, rel.QualifiedName(), rel.QualifiedName())
				}
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// sourceIs reports whether c counts rows of rel.
func sourceIs(c config.Counter, rel *cdc.Relation) bool {
	schema, table := c.SourceTable()
	return schema == rel.Namespace && table == rel.Name
}

// Type OIDs whose text form walcount canonicalises in filters.
const (
	oidBool = 16
	oidInt8 = 20
	oidInt2 = 21
	oidInt4 = 23
)

// canonicalValue rewrites a configured filter value into the text form
// pgoutput uses for the column's type, so that `true` matches "t" and
// "007" matches "7". Other types compare as written.
func canonicalValue(typeOID uint32, v *string) *string {
	if v == nil {
		return nil
	}
	out := *v
	switch typeOID {
	case oidBool:
		switch strings.ToLower(strings.TrimSpace(out)) {
		case "t", "true", "yes", "on", "1", "y":
			out = "t"
		case "f", "false", "no", "off", "0", "n":
			out = "f"
		}
	case oidInt2, oidInt4, oidInt8:
		if n, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64); err == nil {
			out = strconv.FormatInt(n, 10)
		}
	}
	return &out
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
		} else if c.amount, err = parseInt(s.Data); err != nil {
			return contribution{}, err
		}
	}
	return c, nil
}

// parseInt parses a base-10 int64 without allocating.
func parseInt(b []byte) (int64, error) {
	if len(b) == 0 {
		return 0, fmt.Errorf("%w: empty number", ErrBadValue)
	}
	neg := b[0] == '-'
	if neg || b[0] == '+' {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 19 {
		return 0, fmt.Errorf("%w: %q is not a 64-bit integer", ErrBadValue, b)
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: %q is not an integer", ErrBadValue, b)
		}
		n = n*10 + uint64(c-'0')
	}
	if n > 1<<63-1+boolU(neg) {
		return 0, fmt.Errorf("%w: %q overflows int64", ErrBadValue, b)
	}
	if neg {
		return -int64(n), nil
	}
	return int64(n), nil
}

func boolU(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}
