package cdc

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"
)

// TestSilenceBound runs a stream whose silence bound is far below the
// walsender's own keepalive period (half of wal_sender_timeout, 30 s by
// default) and its status interval: idle for several bounds, it must stay
// up, because its status updates ask the walsender for a keepalive. Then
// the walsender is stopped (SIGSTOP, as a half-open connection looks from
// walcount's side) and Run must fail with ErrStreamSilent.
func TestSilenceBound(t *testing.T) {
	t.Parallel()
	f := newStreamFixture(t)
	const bound = 5 * time.Second
	ctx := context.Background()
	s, err := Connect(ctx, StreamConfig{ConnString: f.url, Slot: f.name, Publication: "walcount",
		StartLSN: f.slot, StatusInterval: time.Minute, SilenceTimeout: bound})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	done := make(chan error, 1)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { done <- s.Run(runCtx) }()
	go func() {
		for b := range s.Batches() {
			s.Release(b)
		}
	}()

	// Idle for three bounds: nothing is written, nothing else asks the
	// server for anything.
	select {
	case err := <-done:
		t.Fatalf("an idle stream with a healthy walsender ended: %v", err)
	case <-time.After(3 * bound):
	}

	pid := int(s.BackendPID())
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP walsender %d: %v", pid, err)
	}
	defer func() { _ = syscall.Kill(pid, syscall.SIGCONT) }()
	stopped := time.Now()
	select {
	case err := <-done:
		if !errors.Is(err, ErrStreamSilent) {
			t.Fatalf("Run = %v, want ErrStreamSilent", err)
		}
		t.Logf("declared silent %s after SIGSTOP: %v", time.Since(stopped).Round(time.Millisecond), err)
	case <-time.After(time.Minute):
		t.Fatal("Run did not end within a minute of the walsender being stopped")
	}
}
