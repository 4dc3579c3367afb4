// Command walcount keeps counter-cache columns exact by following the
// PostgreSQL WAL. See README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/internal/operator"
)

// Exit codes (docs/design.md §6), as README.md states them for scripts.
const (
	exitOK = 0
	// exitFailure is a runtime problem, which a restart may cure: a
	// server that does not answer, a database walcount cannot run against
	// yet, a warning of walcount status.
	exitFailure = 1
	// exitUsage is what only a person can fix: an unknown command or
	// flag, a bad setting, a preflight problem only the configuration can
	// fix, a refused login, a missing privilege, a newer state schema.
	exitUsage = 2
	// exitDrift is walcount reconcile --dry-run's status when it found
	// drift. It is neither 1, which says the reconciliation could not
	// run, nor 2, so that a script can tell "the counters are off" from
	// "the question could not be answered".
	exitDrift = 3
)

// usageError marks a command-line mistake (exit 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// exitCodeError carries an explicit exit code with an already printed
// outcome (walcount check finding problems).
type exitCodeError struct{ code int }

func (e exitCodeError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	os.Exit(exitCode(err))
}

func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var ec exitCodeError
	if errors.As(err, &ec) {
		return ec.code
	}
	fmt.Fprintln(os.Stderr, "walcount:", err)
	return exitStatus(err)
}

// exitStatus maps an error to the exit code scripts and supervisors may
// rely on (README.md, "Exit codes"): 2 for what only a person can fix, so
// that a supervisor does not restart walcount in vain (a usage or
// configuration error, a refused login, a missing privilege, a state
// schema of a newer walcount: every operator.Class but None), and 1 for
// everything else, which a restart may cure (a server down).
func exitStatus(err error) int {
	var cfgErr *config.Error
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &cfgErr), errors.As(err, &ue):
		return exitUsage
	case operator.ClassOf(err) != operator.None:
		// A *preflight.Refusal says its class (configuration or
		// privilege), and so do the state schema's errors.
		return exitUsage
	case errors.Is(err, cdc.ErrPublicationMissing):
		// Every retry decodes the same change: the publication or the
		// slot must be fixed (walcount setup).
		return exitUsage
	case errors.Is(err, buffer.ErrOtherDeployment):
		// Two deployments share a Redis and a slot name: the
		// configuration of one of them must change.
		return exitUsage
	}
	return exitFailure
}
