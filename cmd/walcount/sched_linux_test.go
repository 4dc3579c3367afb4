package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSetBatchScheduling moves the test process to SCHED_BATCH (harmless
// for the other tests: it only gives up wakeup preemption) and checks
// every thread, including threads the runtime starts afterwards.
func TestSetBatchScheduling(t *testing.T) {
	if err := setBatchScheduling(); err != nil {
		t.Fatal(err)
	}
	// Goroutines locked to their threads while they sleep force the
	// runtime to start new threads for everything else.
	var wg sync.WaitGroup
	release := make(chan struct{})
	started := make(chan struct{}, 8)
	for range 8 {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			started <- struct{}{}
			<-release
		})
	}
	for range 8 {
		<-started
	}
	tids, err := threadIDs()
	if err != nil {
		t.Fatal(err)
	}
	close(release)
	wg.Wait()
	if len(tids) < 9 {
		t.Fatalf("only %d threads: the test did not start new ones", len(tids))
	}
	for _, tid := range tids {
		policy, err := schedPolicy(tid)
		if err != nil {
			continue // exited since
		}
		if policy != unix.SCHED_BATCH {
			t.Errorf("thread %d has scheduling policy %d, want SCHED_BATCH (%d)", tid, policy, unix.SCHED_BATCH)
		}
	}
}

// checkBatchThreads checks that every thread of pid runs under SCHED_BATCH.
func checkBatchThreads(t *testing.T, pid int) {
	t.Helper()
	policies, err := processPolicies(pid)
	if err != nil {
		t.Errorf("read the threads of %d: %v", pid, err)
		return
	}
	if len(policies) == 0 {
		t.Errorf("process %d has no threads to check", pid)
	}
	for tid, p := range policies {
		if p != unix.SCHED_BATCH {
			t.Errorf("thread %d of %d has scheduling policy %d, want SCHED_BATCH (%d)", tid, pid, p, unix.SCHED_BATCH)
		}
	}
}

// processPolicies returns the scheduling policy of every thread of pid.
func processPolicies(pid int) (map[int]int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	out := map[int]int{}
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, err := schedPolicy(tid); err == nil {
			out[tid] = p
		}
	}
	return out, nil
}
