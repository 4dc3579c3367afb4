package main

import (
	"context"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"
)

// killTwiceUnderLoad runs op in a loop on three clients of the app (each
// with a random source of its own) while killTwice kills walcount twice,
// stops them half a second after the last walcount streams, reports every
// write of theirs that failed, and returns the last walcount.
func killTwiceUnderLoad(t *testing.T, env []string, addr string, op func(ctx context.Context, rng *rand.Rand) error) *proc {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	var failed sync.Map
	for w := range 3 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for ctx.Err() == nil {
				if err := op(ctx, rng); err != nil && ctx.Err() == nil {
					failed.Store(err.Error(), true)
				}
			}
		})
	}
	last := killTwice(t, env, addr)
	time.Sleep(500 * time.Millisecond)
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
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		n := c.count(off)
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%d %s still off a minute after the load ended", n, what)
		}
	}
	time.Sleep(time.Second)
	if n := c.count(off); n != 0 {
		c.t.Fatalf("%d %s off after they were exact", n, what)
	}
}
