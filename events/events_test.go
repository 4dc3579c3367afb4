package events

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/metrics"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

func testPublisher(t *testing.T) (*Publisher, *redis.Client, *metrics.Metrics) {
	t.Helper()
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	m := metrics.New()
	c := counter.Default()
	p := New(Options{Redis: rdb, Slot: "events_" + strconv.Itoa(int(rdb.Options().DB)) + "_" + t.Name(), Counters: []counter.Counter{c}, MaxLen: 100000, Metrics: m})
	if !p.Covers(c.Name) {
		t.Fatalf("the default count is not covered")
	}
	return p, rdb, m
}

// TestPublishSettlesTheOutboxAndRefusesOlderLSNs publishes a batch of more
// entries than one script takes: every entry reaches the stream, in order,
// and the outbox is empty after; a later batch at a lower LSN (a walcount
// publishing after another took over) is refused whole and counted; a gap
// starts the order again, so a lower LSN after it is taken.
func TestPublishSettlesTheOutboxAndRefusesOlderLSNs(t *testing.T) {
	p, rdb, m := testPublisher(t)
	ctx := context.Background()
	name := counter.Default().Name
	var fields []string
	var entries []Entry
	for k := range 2500 {
		fields = append(fields, counter.Field(name, strconv.Itoa(k)))
		entries = append(entries, Entry{Counter: name, Key: strconv.Itoa(k), Value: strconv.Itoa(k * 2)})
	}
	members, err := p.Due(ctx, fields, nil)
	if err != nil || len(members) != len(fields) {
		t.Fatalf("Due: %d members, %v", len(members), err)
	}
	if err := p.Publish(ctx, Batch{LSN: 200, Entries: entries, Done: members}); err != nil {
		t.Fatal(err)
	}
	stream := Stream(p.opt.Slot, name)
	msgs, err := rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil || len(msgs) != len(entries) {
		t.Fatalf("XRANGE: %d entries, %v; want %d", len(msgs), err, len(entries))
	}
	for i, msg := range msgs {
		if want := fmt.Sprint(map[string]any{"key": strconv.Itoa(i), "value": strconv.Itoa(i * 2), "lsn": LSN(200).String()}); fmt.Sprint(msg.Values) != want {
			t.Fatalf("entry %d: %v, want %s", i, msg.Values, want)
		}
	}
	if n, err := rdb.SCard(ctx, outboxKey(p.opt.Slot)).Result(); err != nil || n != 0 {
		t.Errorf("the outbox holds %d members after the publication (%v)", n, err)
	}

	if err := p.Publish(ctx, Batch{LSN: 100, Entries: entries[:1]}); err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.XLen(ctx, stream).Result(); n != int64(len(entries)) {
		t.Errorf("an older publication was taken: %d entries", n)
	}
	if got := counterValue(m.EventsStale); got != 1 {
		t.Errorf("walcount_events_stale_total = %v, want 1", got)
	}

	if err := p.Gap(ctx, 50, "test"); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(ctx, Batch{LSN: 60, Entries: entries[:1], Resets: []string{name}}); err != nil {
		t.Fatal(err)
	}
	last, err := rdb.XRevRangeN(ctx, stream, "+", "-", 3).Result()
	if err != nil || len(last) != 3 {
		t.Fatalf("XREVRANGE: %v %v", last, err)
	}
	if last[2].Values["gap"] != "test" || last[1].Values["reset"] != "truncate" || last[0].Values["key"] != "0" || last[0].Values["lsn"] != LSN(60).String() {
		t.Errorf("after the gap: %v, want the gap, the reset and key 0 at %s", last, LSN(60))
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}
