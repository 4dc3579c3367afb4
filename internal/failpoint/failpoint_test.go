package failpoint

import (
	"errors"
	"testing"
)

func TestSetsAreIndependent(t *testing.T) {
	var a, b Set
	disarm := a.CrashAfter(AfterApply, 2)
	if err := a.Inject(AfterApply); err != nil {
		t.Fatalf("first call: %v", err)
	}
	if err := b.Inject(AfterApply); err != nil {
		t.Fatalf("another set fired: %v", err)
	}
	if err := a.Inject(AfterApply); !errors.Is(err, ErrCrash) {
		t.Fatalf("second call = %v, want ErrCrash", err)
	}
	disarm()
	if err := a.Inject(AfterApply); err != nil {
		t.Fatalf("disarmed: %v", err)
	}
	var none *Set
	if err := none.Inject(AfterApply); err != nil {
		t.Fatalf("nil set: %v", err)
	}
}
