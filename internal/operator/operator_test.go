package operator

import (
	"errors"
	"fmt"
	"testing"
)

func TestNeeded(t *testing.T) {
	stop := NewError("needs a hand")
	if !Needed(fmt.Errorf("session: %w", stop)) || !errors.Is(fmt.Errorf("x: %w", stop), stop) {
		t.Error("a wrapped operator error is not classified, or no longer matches errors.Is")
	}
	if Needed(errors.New("connection reset")) || Needed(nil) || Needed(fmt.Errorf("x: %v", stop)) {
		t.Error("an error that does not wrap an operator error is classified as needing one")
	}
}
