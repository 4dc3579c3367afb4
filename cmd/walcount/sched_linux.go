package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"unsafe"
)

const schedBatch = 3 // SCHED_BATCH

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
			policy, err := schedPolicy(tid)
			if errors.Is(err, syscall.ESRCH) {
				continue // the thread exited
			}
			if err != nil {
				return err
			}
			if policy == schedBatch {
				continue
			}
			var param struct{ priority int32 } // must be 0 for SCHED_BATCH
			_, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_SETSCHEDULER, uintptr(tid), schedBatch, uintptr(unsafe.Pointer(&param)))
			if errno == syscall.ESRCH {
				continue
			}
			if errno != 0 {
				return fmt.Errorf("sched_setscheduler(%d, SCHED_BATCH): %w", tid, errno)
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
	r, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_GETSCHEDULER, uintptr(tid), 0, 0)
	if errno != 0 {
		return 0, fmt.Errorf("sched_getscheduler(%d): %w", tid, errno)
	}
	return int(r), nil
}
