package reconcile

import (
	"context"
	"fmt"
	"math"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/counter"
)

// survey measures a whole range of target keys in one snapshot, with the
// statements counter.Resolved holds for it (see counter's buildSurvey):
// integer keys in ranges of values, where keys are dense, or of a counted
// number of keys, where they are sparse; other keys in counted ranges.
type survey struct {
	intKeys bool
	// first, next and bounds find ranges (see counter.Resolved.Survey*).
	first, next, bounds string
	compare             string
	// args are bound after $1 and $2 (the range's first and last key):
	// the where filters, then the slot (whose carried deltas count in the
	// column).
	args []any
	// sparse: the last integer range held fewer than half its width.
	sparse bool
}

// newSurvey returns the survey of sql's counter kept by slot.
func newSurvey(sql *counter.Resolved, slot string) *survey {
	return &survey{
		intKeys: sql.SurveyIntKeys,
		first:   sql.SurveyFirst, next: sql.SurveyNext, bounds: sql.SurveyBounds,
		compare: sql.SurveyCompare,
		args:    append(append([]any(nil), sql.FilterArgs...), slot),
	}
}

// surveyed is what a survey read: the range's size and last key, and the
// keys whose column differs from their true value in the snapshot.
type surveyed struct {
	n    int64
	last string
	off  map[string]surveyedKey
}

type surveyedKey struct{ column, truth int64 }

// read surveys the range of up to limit keys after after ("" for the
// start) in tx.
func (sv *survey) read(ctx context.Context, tx pgx.Tx, after string, limit int) (surveyed, error) {
	out, err := sv.readInt(ctx, tx, after, limit)
	if !sv.intKeys {
		out, err = sv.readOrdered(ctx, tx, after, limit)
	}
	if err != nil {
		return surveyed{}, fmt.Errorf("survey target keys: %w", err)
	}
	return out, nil
}

func (sv *survey) readInt(ctx context.Context, tx pgx.Tx, after string, limit int) (surveyed, error) {
	var lo *int64
	var err error
	if after == "" {
		err = tx.QueryRow(ctx, sv.first).Scan(&lo)
	} else {
		var a int64
		if a, err = strconv.ParseInt(after, 10, 64); err != nil {
			return surveyed{}, err
		}
		err = tx.QueryRow(ctx, sv.next, a).Scan(&lo)
	}
	if err != nil || lo == nil {
		return surveyed{}, err // no key after the last range
	}
	var hi int64
	if sv.sparse {
		if err := tx.QueryRow(ctx, sv.bounds, *lo, limit).Scan(&hi); err != nil {
			return surveyed{}, err
		}
	} else if hi = *lo + int64(limit) - 1; hi < *lo {
		hi = math.MaxInt64
	}
	var last *string
	var keys []string
	var cols, truths []int64
	out := surveyed{off: map[string]surveyedKey{}}
	args := append([]any{*lo, hi}, sv.args...)
	if err := tx.QueryRow(ctx, sv.compare, args...).Scan(&out.n, &last, &keys, &cols, &truths); err != nil {
		return surveyed{}, err
	}
	if last != nil {
		out.last = *last
	}
	for i, k := range keys {
		out.off[k] = surveyedKey{column: cols[i], truth: truths[i]}
	}
	// Dense keys make value ranges; where they are sparse, the next range
	// is counted.
	sv.sparse = float64(out.n) < (float64(hi)-float64(*lo)+1)/2
	return out, nil
}

func (sv *survey) readOrdered(ctx context.Context, tx pgx.Tx, after string, limit int) (surveyed, error) {
	var a any
	if after != "" {
		a = after
	}
	out := surveyed{off: map[string]surveyedKey{}}
	var lo, hi *string
	if err := tx.QueryRow(ctx, sv.bounds, a, limit).Scan(&lo, &hi, &out.n); err != nil {
		return surveyed{}, err
	}
	if out.n == 0 || lo == nil || hi == nil {
		return surveyed{}, nil
	}
	out.last = *hi
	rows, err := tx.Query(ctx, sv.compare, append([]any{*lo, *hi}, sv.args...)...)
	if err != nil {
		return surveyed{}, err
	}
	var k string
	var col, truth int64
	_, err = pgx.ForEachRow(rows, []any{&k, &col, &truth}, func() error {
		out.off[k] = surveyedKey{column: col, truth: truth}
		return nil
	})
	return out, err
}

// inRange reports whether key is in the range (after, last] that a survey
// covered. It knows only for integer keys; ok is false otherwise.
func (sv *survey) inRange(key, after, last string) (in, ok bool) {
	if !sv.intKeys {
		return false, false
	}
	k, err1 := strconv.ParseInt(key, 10, 64)
	hi, err2 := strconv.ParseInt(last, 10, 64)
	if err1 != nil || err2 != nil {
		return false, false
	}
	if after != "" {
		lo, err := strconv.ParseInt(after, 10, 64)
		if err != nil {
			return false, false
		}
		if k <= lo {
			return false, true
		}
	}
	return k <= hi, true
}
