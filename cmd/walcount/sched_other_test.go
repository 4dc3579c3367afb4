//go:build !linux

package main

import "testing"

// checkBatchThreads: cpu_scheduling: batch is Linux-only.
func checkBatchThreads(*testing.T, int) {}
