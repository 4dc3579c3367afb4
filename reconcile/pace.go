package reconcile

import (
	"context"
	"time"
)

// Clock is the time a Pacer keeps to; tests give it a fake one.
type Clock interface {
	Now() time.Time
	// Sleep waits d, or until ctx is done.
	Sleep(ctx context.Context, d time.Duration) error
}

// realClock is the wall clock.
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Pacer keeps a pass to at most Rate keys per second: Wait(n) returns
// once the keys read before have had their share of time, n/Rate seconds
// each batch. The first batch starts at once, so by any time t after the
// start at most Rate·t keys plus one batch were read; batches are kept to
// one second's worth (Batch), so that is at most Rate·(t+1).
// A Pacer is used by one goroutine.
type Pacer struct {
	// Rate is in keys per second; 0 means no limit.
	Rate  int
	clock Clock
	// next is when the next batch may start.
	next time.Time
}

// NewPacer returns a pacer of rate keys per second on clock (nil means the
// wall clock).
func NewPacer(rate int, clock Clock) *Pacer {
	if clock == nil {
		clock = realClock{}
	}
	return &Pacer{Rate: rate, clock: clock}
}

// Batch returns n, or one second's worth of keys when that is fewer.
func (p *Pacer) Batch(n int) int {
	if p.Rate > 0 && n > p.Rate {
		return p.Rate
	}
	return n
}

// Wait waits until n more keys may be read.
func (p *Pacer) Wait(ctx context.Context, n int) error {
	if p.Rate <= 0 || n <= 0 {
		return nil
	}
	now := p.clock.Now()
	if p.next.After(now) {
		if err := p.clock.Sleep(ctx, p.next.Sub(now)); err != nil {
			return err
		}
	} else {
		// Time spent measuring counts: a pass slower than the rate is not
		// made slower still.
		p.next = now
	}
	p.next = p.next.Add(time.Duration(float64(n) * float64(time.Second) / float64(p.Rate)))
	return nil
}
