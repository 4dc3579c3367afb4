package reconcile

import "github.com/walcount/walcount/state"

// RunInfo is one reconciliation run as /status and walcount reconcile show
// it; the state package stores it.
type RunInfo = state.Run

// KeyDrift is one key whose column is off.
type KeyDrift = state.KeyDrift
