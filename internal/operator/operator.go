// Package operator lets an error say that it needs an operator: walcount
// run stops on it (exit 1, with the fix in its message) instead of
// retrying the session. An error says so itself, by a NeedsOperator
// method, as pgx's errors say SafeToRetry; the daemon keeps no list of
// them.
package operator

import "errors"

// Classifier is an error that says whether it needs an operator.
type Classifier interface {
	error
	NeedsOperator() bool
}

// Needed reports whether err, or an error it wraps, needs an operator:
// the first error of its chain that is a Classifier decides.
func Needed(err error) bool {
	var c Classifier
	return errors.As(err, &c) && c.NeedsOperator()
}

// NewError returns a sentinel error with text that needs an operator
// (errors.New's, classified).
func NewError(text string) error { return &sentinel{text} }

type sentinel struct{ s string }

func (e *sentinel) Error() string       { return e.s }
func (e *sentinel) NeedsOperator() bool { return true }
