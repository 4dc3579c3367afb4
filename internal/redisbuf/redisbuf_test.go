package redisbuf

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/walcount/walcount/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func newBuffer(t *testing.T) (*Buffer, *redis.Client) {
	t.Helper()
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	return New(rdb, "s1"), rdb
}

func TestKeysShareAHashTag(t *testing.T) {
	k := KeysFor("walcount")
	for _, key := range k.All() {
		if want := "walcount:{walcount}:"; key[:len(want)] != want {
			t.Errorf("key %q lacks the hash tag prefix %q", key, want)
		}
	}
}

func TestLSNFormatSortsLikeLSNs(t *testing.T) {
	a, b := FormatLSN(0x9_00000000), FormatLSN(0x10_00000000)
	if !(a < b) {
		t.Fatalf("%s !< %s", a, b)
	}
	if l, err := ParseLSN(FormatLSN(0xFFFF_FFFF_FFFF_FFFE)); err != nil || l != 0xFFFF_FFFF_FFFF_FFFE {
		t.Fatalf("round trip: %s, %v", l, err)
	}
}

func TestApplyIsIdempotentAndChained(t *testing.T) {
	ctx := context.Background()
	b, rdb := newBuffer(t)
	if _, err := b.Apply(ctx, 10, 20, []Delta{{"c:1", 1}}); !errors.Is(err, ErrChainBroken) {
		t.Fatalf("apply without meta: err = %v, want ErrChainBroken", err)
	}
	if err := b.Reset(ctx, 10); err != nil {
		t.Fatal(err)
	}
	ok, err := b.Apply(ctx, 10, 20, []Delta{{"c:1", 2}, {"c:2", 1}})
	if err != nil || !ok {
		t.Fatalf("first apply: %v, %v", ok, err)
	}
	// The same batch again (a retried call) changes nothing.
	ok, err = b.Apply(ctx, 10, 20, []Delta{{"c:1", 2}, {"c:2", 1}})
	if err != nil || ok {
		t.Fatalf("replayed apply: ok=%v err=%v; want ignored", ok, err)
	}
	// A batch that leaves a hole is refused.
	if _, err := b.Apply(ctx, 25, 30, []Delta{{"c:1", 1}}); !errors.Is(err, ErrChainBroken) {
		t.Fatalf("apply with a gap: err = %v, want ErrChainBroken", err)
	}
	// Deltas that cancel out remove the field.
	if _, err := b.Apply(ctx, 20, 30, []Delta{{"c:2", -1}}); err != nil {
		t.Fatal(err)
	}
	got, err := rdb.HGetAll(ctx, b.Keys().Buffer).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["c:1"] != "2" {
		t.Fatalf("buffer = %v, want c:1=2 only", got)
	}
	m, err := b.Meta(ctx)
	if err != nil || m.LSN != 30 || m.Base != 10 || m.Flushing {
		t.Fatalf("meta = %+v, %v", m, err)
	}
}

func TestHandOverResumeAndDone(t *testing.T) {
	ctx := context.Background()
	b, rdb := newBuffer(t)
	if err := b.Reset(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := b.HandOver(ctx, 100); err != nil || ok {
		t.Fatalf("empty hand-over: ok=%v err=%v", ok, err)
	}
	if _, err := b.Apply(ctx, 100, 200, []Delta{{"c:1", 5}}); err != nil {
		t.Fatal(err)
	}
	from, upto, ok, err := b.HandOver(ctx, 100)
	if err != nil || !ok || from != 100 || upto != 200 {
		t.Fatalf("hand-over = %s %s %v %v", from, upto, ok, err)
	}
	// New deltas go to a new buffer while the flush is in progress.
	if _, err := b.Apply(ctx, 200, 300, []Delta{{"c:1", 1}}); err != nil {
		t.Fatal(err)
	}
	// A second hand-over (a retry after a crash) resumes the same range.
	from2, upto2, ok, err := b.HandOver(ctx, 100)
	if err != nil || !ok || from2 != 100 || upto2 != 200 {
		t.Fatalf("resumed hand-over = %s %s %v %v", from2, upto2, ok, err)
	}
	fl, err := b.Flushing(ctx)
	if err != nil || fl["c:1"] != "5" {
		t.Fatalf("flushing = %v, %v", fl, err)
	}
	if err := b.Done(ctx, 100, 200); err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.Exists(ctx, b.Keys().Flushing).Result(); n != 0 {
		t.Fatal("flushing still exists after Done")
	}
	from, upto, ok, err = b.HandOver(ctx, 200)
	if err != nil || !ok || from != 200 || upto != 300 {
		t.Fatalf("next hand-over = %s %s %v %v", from, upto, ok, err)
	}
}

func TestHandOverAfterCommitBeforeDone(t *testing.T) {
	ctx := context.Background()
	b, _ := newBuffer(t)
	if err := b.Reset(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(ctx, 100, 200, []Delta{{"c:1", 5}}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := b.HandOver(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(ctx, 200, 300, []Delta{{"c:1", 1}}); err != nil {
		t.Fatal(err)
	}
	// PostgreSQL committed (W = 200) but DEL flushing never ran: the
	// next hand-over from W discards the applied batch and goes on.
	from, upto, ok, err := b.HandOver(ctx, 200)
	if err != nil || !ok || from != 200 || upto != 300 {
		t.Fatalf("hand-over = %s %s %v %v", from, upto, ok, err)
	}
	fl, _ := b.Flushing(ctx)
	if fl["c:1"] != "1" {
		t.Fatalf("flushing = %v, want only the new batch", fl)
	}
}

func TestHandOverDetectsForeignChain(t *testing.T) {
	ctx := context.Background()
	b, _ := newBuffer(t)
	if _, _, _, err := b.HandOver(ctx, 100); !errors.Is(err, ErrChainBroken) {
		t.Fatalf("no meta: err = %v", err)
	}
	if err := b.Reset(ctx, 50); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(ctx, 50, 80, []Delta{{"c:1", 1}}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := b.HandOver(ctx, 100); !errors.Is(err, ErrChainBroken) {
		t.Fatalf("buffer starting before W: err = %v, want ErrChainBroken", err)
	}
}

func TestAdvance(t *testing.T) {
	ctx := context.Background()
	b, _ := newBuffer(t)
	if err := b.Reset(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if err := b.Advance(ctx, 10, 40); err != nil {
		t.Fatal(err)
	}
	if m, _ := b.Meta(ctx); m.LSN != 40 || m.Base != 40 {
		t.Fatalf("meta = %+v", m)
	}
	if _, err := b.Apply(ctx, 40, 50, []Delta{{"c:1", 1}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Advance(ctx, 50, 60); !errors.Is(err, ErrChainBroken) {
		t.Fatalf("advance over a non-empty buffer: err = %v", err)
	}
}
