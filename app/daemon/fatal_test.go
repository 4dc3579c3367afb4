package daemon

import (
	"errors"
	"fmt"
	"testing"

	"github.com/walcount/walcount/aggregator"
	"github.com/walcount/walcount/buffer"
	"github.com/walcount/walcount/cdc"
	"github.com/walcount/walcount/counter"
	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/slot"
	"github.com/walcount/walcount/state"
)

// TestFatalErrorsClassifyThemselves: the errors that stop the daemon say
// so themselves (operator.Needed), wrapped or not, and those a session
// retries do not.
func TestFatalErrorsClassifyThemselves(t *testing.T) {
	t.Parallel()
	for _, err := range []error{failpoint.ErrCrash, aggregator.ErrNotAttributable, counter.ErrBadValue, counter.ErrBadTarget,
		counter.ErrPartialView, state.ErrNoCheckpoint, state.ErrNotSetUp, state.ErrSchemaVersion, state.ErrOwned,
		state.ErrNotClaimed, cdc.ErrSlotMissing, buffer.ErrOtherDeployment, cdc.ErrPooler, &slot.SlotLostError{Slot: "s"}} {
		if !fatal(fmt.Errorf("session: %w", err)) {
			t.Errorf("%v does not stop the daemon", err)
		}
	}
	for _, err := range []error{cdc.ErrSlotInUse, cdc.ErrStreamSilent, errors.New("connection reset by peer")} {
		if fatal(fmt.Errorf("session: %w", err)) {
			t.Errorf("%v stops the daemon, want a retry", err)
		}
	}
}
