package sink

import (
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/walcount/walcount/internal/metrics"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/state"
)

// TestPlanRunsMovesOnCarried: the batch's lifecycle moves run on the
// deltas earlier flushes carried before they join the batch's; a parked
// key keeps the batch's delta until it is due, then is tried in a batch
// of its own.
func TestPlanRunsMovesOnCarried(t *testing.T) {
	c := counter.Default()
	f := &Flusher{opt: Options{Metrics: metrics.New()}, log: zap.NewNop(), targets: map[string]*counter.Resolved{c.Name: {Counter: c, IntKey: true}}}
	then := time.Now().Add(-time.Minute)
	prior := []state.Carried{
		{Counter: c.Name, Key: "1", Delta: 5, Since: then, Due: true},                  // re-keyed to 10
		{Counter: c.Name, Key: "2", Delta: 3, Since: then, Due: true},                  // deleted
		{Counter: c.Name, Key: "3", Delta: 2, Since: then, Parked: "boom", Due: true},  // parked, due
		{Counter: c.Name, Key: "5", Delta: 1, Since: then, Parked: "boom", Due: false}, // parked, not due
		{Counter: c.Name, Key: "6", Delta: 4, Since: then, Due: true},                  // re-keyed onto 7, which has its own
		{Counter: c.Name, Key: "7", Delta: 1, Since: then.Add(time.Second), Due: true}, // deleted before 6 takes its key
		{Counter: c.Name, Key: "8", Delta: -2, Since: then, Due: true},                 // cancelled by the batch
		{Counter: "gone", Key: "1", Delta: 9, Since: then, Due: true},                  // a counter no longer configured
	}
	moves := []counter.Move{
		{Field: "post_likes:1", To: "post_likes:10"},
		{Field: "post_likes:2", To: ""},
		{Field: "post_likes:7", To: ""},
		{Field: "post_likes:6", To: "post_likes:7"},
	}
	fields := map[string]int64{"post_likes:10": 1, "post_likes:3": 1, "post_likes:4": 2, "post_likes:5": 2, "post_likes:8": 2, "post_likes:7": 1}
	batches, out, err := f.plan(fields, moves, prior)
	if err != nil {
		t.Fatal(err)
	}
	got := map[bool]map[string]int64{false: {}, true: {}}
	for _, b := range batches {
		for i, k := range b.keys {
			got[b.careful][k] = b.deltas[i]
		}
		if !slices.IsSortedFunc(b.keys, func(x, y string) int {
			a, _ := strconv.Atoi(x)
			b, _ := strconv.Atoi(y)
			return a - b
		}) {
			t.Errorf("keys not in numeric order: %v", b.keys)
		}
	}
	if want := map[string]int64{"10": 6, "4": 2, "7": 5}; !maps.Equal(got[false], want) {
		t.Errorf("tried = %v, want %v", got[false], want)
	}
	if want := map[string]int64{"3": 3}; !maps.Equal(got[true], want) {
		t.Errorf("retried (parked, due) = %v, want %v", got[true], want)
	}
	if len(out.carry) != 1 || out.carry[0].Key != "5" || out.carry[0].Delta != 3 || out.carry[0].Parked != "boom" {
		t.Errorf("still carried = %+v, want key 5 parked with 1+2", out.carry)
	}
	if p := f.prior["post_likes:10"]; !p.Since.Equal(then) {
		t.Errorf("the re-keyed delta lost when it was first carried: %+v", p)
	}
}
