//go:build !linux

package main

import "errors"

// setBatchScheduling needs Linux's per-thread SCHED_BATCH.
func setBatchScheduling() error {
	return errors.New("cpu_scheduling: batch is only available on Linux")
}
