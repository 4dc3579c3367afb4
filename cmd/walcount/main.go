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

	"github.com/walcount/walcount/internal/config"
	"github.com/walcount/walcount/internal/preflight"
)

// Exit codes (DESIGN §6).
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
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

// exitStatus maps an error to the exit code scripts may rely on: 2 for a
// usage or configuration error, a preflight refusal the configuration must
// fix included, and 1 for everything else.
func exitStatus(err error) int {
	var cfgErr *config.Error
	var ue usageError
	var ref *preflight.Refusal
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &cfgErr), errors.As(err, &ue):
		return exitUsage
	case errors.As(err, &ref) && ref.ConfigProblem():
		return exitUsage
	}
	return exitFailure
}
