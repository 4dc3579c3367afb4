package operator

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
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

func TestClassOf(t *testing.T) {
	newer := NewClassedError(NewerState, "made by a newer walcount")
	for _, tt := range []struct {
		err  error
		want Class
	}{
		{nil, None},
		{errors.New("connection reset"), None},
		{NewError("needs a hand"), None},
		{fmt.Errorf("session: %w", newer), NewerState},
		{fmt.Errorf("connect: %w", &pgconn.PgError{Code: "28P01"}), Auth},
		{&pgconn.PgError{Code: "28000"}, Auth},
		{fmt.Errorf("flush: %w", &pgconn.PgError{Code: "42501"}), Privilege},
		{&pgconn.PgError{Code: "57P03"}, None},
	} {
		if got := ClassOf(tt.err); got != tt.want {
			t.Errorf("ClassOf(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
	if !Needed(newer) {
		t.Error("a classed error does not need an operator")
	}
}
