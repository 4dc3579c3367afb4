package main

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/walcount/walcount/internal/testkit/wait"
)

// killTwiceUnderLoad runs op in a loop on three clients of the app (each
// with a random source of its own) while killTwice kills walcount twice,
// stops them once they wrote 50 more times after the last walcount streams, reports every
// write of theirs that failed, and returns the last walcount.
func killTwiceUnderLoad(t *testing.T, env []string, addr string, op func(ctx context.Context, rng *rand.Rand) error) *proc {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	var failed sync.Map
	var ops atomic.Int64
	for w := range 3 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for ctx.Err() == nil {
				if err := op(ctx, rng); err != nil && ctx.Err() == nil {
					failed.Store(err.Error(), true)
				}
				ops.Add(1)
			}
		})
	}
	last := killTwice(t, env, addr)
	// The app goes on writing to the last walcount for a while.
	from := ops.Load()
	wait.For(t, time.Minute, "50 more writes of the app", func() bool { return ops.Load() >= from+50 })
	stop()
	wg.Wait()
	failed.Range(func(k, _ any) bool { t.Errorf("the app's write failed: %v", k); return true })
	return last
}

// killTwice runs walcount run with env and kills it with SIGKILL a
// moment after it streams, twice, then starts a last one and returns it
// once that one streams too: the kill -9 rounds of the crash tests.
func killTwice(t *testing.T, env []string, addr string) *proc {
	t.Helper()
	var killed []*proc
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for i, p := range killed {
			out := p.stderr.String()
			if len(out) > 6000 {
				out = out[len(out)-6000:]
			}
			t.Logf("walcount killed in round %d, its log (its end):\n%s", i, out)
		}
	})
	for round := range 2 {
		p := startWalcount(t, env, "run")
		killed = append(killed, p)
		waitStreaming(t, p, addr)
		// A random lifetime, so that the SIGKILL falls anywhere in the
		// flush cycle: the point of the test, not a wait for an event.
		time.Sleep(time.Duration(300+rand.IntN(900)) * time.Millisecond)
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-p.done
		t.Logf("round %d: killed with SIGKILL while streaming", round)
	}
	last := startWalcount(t, env, "run")
	waitStreaming(t, last, addr)
	t.Cleanup(func() {
		if t.Failed() {
			out := last.stderr.String()
			if len(out) > 6000 {
				out = out[len(out)-6000:]
			}
			t.Logf("the last walcount's log (its end):\n%s", out)
		}
	})
	return last
}

// settlesExact waits (a minute at most) until the count query off, the
// rows whose columns differ from the truth, is 0 once the app stopped,
// and checks that it stays 0 a second later; what names the rows.
func (c *cli) settlesExact(off, what string) {
	c.t.Helper()
	var n int
	if !wait.Until(time.Minute, 100*time.Millisecond, func() bool {
		n = c.count(off)
		return n == 0
	}) {
		c.t.Fatalf("%d %s still off a minute after the load ended", n, what)
	}
	// Exact must stay exact: nothing is left to arrive, so there is no
	// event to wait for, only time for a late wrong flush to show.
	time.Sleep(time.Second)
	if n := c.count(off); n != 0 {
		c.t.Fatalf("%d %s off after they were exact", n, what)
	}
}
