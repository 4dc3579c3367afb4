package main

import (
	"go.uber.org/zap"

	"github.com/walcount/walcount/app/config"
)

// applyCPUScheduling puts walcount run's threads under the scheduling
// policy cfg names (config.Config.CPUScheduling). Under batch, a walcount
// thread that wakes up (every few milliseconds while WAL streams in)
// waits for the running thread's time slice instead of preempting it: on
// a host shared with PostgreSQL that running thread is often a backend
// holding a lock the app's other backends queue on. walcount's share of
// the CPU is unchanged, and its latency budget (the flush interval) is
// orders of magnitude above a time slice. Failing to apply it is not
// fatal: walcount runs with the normal policy and says so.
func applyCPUScheduling(policy string, log *zap.Logger) {
	if policy != config.CPUSchedulingBatch {
		return
	}
	if err := setBatchScheduling(); err != nil {
		log.Warn("could not apply cpu_scheduling: batch; running with the normal policy", zap.Error(err))
		return
	}
	log.Debug("threads scheduled as SCHED_BATCH (cpu_scheduling: batch)")
}
