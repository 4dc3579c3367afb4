package daemon

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/walcount/walcount/buffer"
)

// TestBufferTakenByAnotherDeploymentStops: the walcount of another cluster
// (another system identifier), started at the same moment with the same
// Redis and slot name, resets this daemon's buffer and stamps it as its
// own, as its recovery does. This daemon's next write finds its chain
// broken; its next session must see a live chain of another system and stop
// with buffer.ErrOtherDeployment and the fix, not reset it back (which is
// what made two such deployments reset each other over and over).
func TestBufferTakenByAnotherDeploymentStops(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	d := e.start()
	newWorkload(e.db).run(ctx, 2, 20)
	e.waitCaughtUp(catchUp)

	other := buffer.New(e.rdb(), e.cfg.Slot)
	const theirs = "7000000000000000001"
	w, err := e.checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The other cluster's checkpoint is at a position of its own WAL.
	if err := other.Reset(ctx, w+1<<20, theirs+"/1"); err != nil {
		t.Fatal(err)
	}
	if ok, err := other.MarkAlive(ctx, theirs, time.Now()); err != nil || !ok {
		t.Fatalf("stamp the other deployment's chain: %v, %v", ok, err)
	}
	// The other deployment keeps stamping while it runs.
	stamp, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for stamp.Err() == nil {
			_, _ = other.MarkAlive(stamp, theirs, time.Now())
			// The other deployment's own pace of stamps (a live
			// system stamps every buffer.AliveInterval), not a wait.
			time.Sleep(200 * time.Millisecond)
		}
	}()
	newWorkload(e.db).run(ctx, 2, 20)
	err = d.wait(t, time.Minute)
	if !errors.Is(err, buffer.ErrOtherDeployment) || !strings.Contains(err.Error(), theirs) || !strings.Contains(err.Error(), "Fix:") {
		t.Fatalf("Run = %v, want buffer.ErrOtherDeployment naming system %s with the fix", err, theirs)
	}
	if h, _ := other.Meta(ctx); buffer.System(h.History) != theirs {
		t.Errorf("the other deployment's chain was reset to %q", h.History)
	}
}
