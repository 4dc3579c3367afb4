package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// setBatchScheduling moves every thread of the process to SCHED_BATCH.
// Linux sets the policy per thread and a new thread inherits its
// creator's, so once every existing thread has it, the threads the Go
// runtime starts later have it too. A thread started while the loop runs
// could be cloned from one not yet moved: the loop repeats until a pass
// finds every thread already under SCHED_BATCH.
func setBatchScheduling() error {
	for range 10 {
		tids, err := threadIDs()
		if err != nil {
			return err
		}
		moved := 0
		for _, tid := range tids {
			attr, err := unix.SchedGetAttr(tid, 0)
			if errors.Is(err, unix.ESRCH) {
				continue // the thread exited
			}
			if err != nil {
				return fmt.Errorf("sched_getattr(%d): %w", tid, err)
			}
			if attr.Policy == unix.SCHED_BATCH {
				continue
			}
			// The thread keeps its nice value; the priority must be 0.
			attr.Policy, attr.Priority = unix.SCHED_BATCH, 0
			err = unix.SchedSetAttr(tid, attr, 0)
			if errors.Is(err, unix.ESRCH) {
				continue
			}
			if err != nil {
				return fmt.Errorf("sched_setattr(%d, SCHED_BATCH): %w", tid, err)
			}
			moved++
		}
		if moved == 0 {
			return nil
		}
	}
	return errors.New("threads kept appearing under another scheduling policy")
}

// threadIDs lists the process's threads.
func threadIDs() ([]int, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, fmt.Errorf("list threads: %w", err)
	}
	tids := make([]int, 0, len(ents))
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

// schedPolicy returns a thread's scheduling policy.
func schedPolicy(tid int) (int, error) {
	attr, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		return 0, fmt.Errorf("sched_getattr(%d): %w", tid, err)
	}
	return int(attr.Policy), nil
}
