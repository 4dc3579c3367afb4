package operator

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// Class is what kind of step by a person an error waits for. walcount's
// commands exit with status 2 for every class but None (README, "Exit
// codes"): a supervisor must not restart a walcount that stopped on one,
// since nothing changes until a person acts. None is a runtime failure
// (exit 1), which a restart may cure.
type Class int

const (
	// None is no class: a runtime failure, or no error.
	None Class = iota
	// Config is a bad setting or command line.
	Config
	// Auth is a refused login: a wrong password, a role that may not
	// connect, a Redis user that does not exist.
	Auth
	// Privilege is a role that lacks a privilege walcount needs, with the
	// statement that grants it in the error.
	Privilege
	// NewerState is walcount's state made by a newer walcount: this
	// binary must not read or write it.
	NewerState
)

// String names the class as the docs do.
func (c Class) String() string {
	switch c {
	case Config:
		return "configuration"
	case Auth:
		return "authentication"
	case Privilege:
		return "privilege"
	case NewerState:
		return "newer state"
	}
	return "runtime"
}

// Classed is an error that says its Class itself.
type Classed interface {
	error
	OperatorClass() Class
}

// ClassOf returns the class of err: that of the first error of its chain
// that says one (Classed), else Auth or Privilege when PostgreSQL refused
// with the SQLSTATE of one (28P01 invalid_password, 28000
// invalid_authorization_specification, 42501 insufficient_privilege),
// else None.
func ClassOf(err error) Class {
	if err == nil {
		return None
	}
	var c Classed
	if errors.As(err, &c) {
		if class := c.OperatorClass(); class != None {
			return class
		}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "28P01", "28000":
			return Auth
		case "42501":
			return Privilege
		}
	}
	return None
}

// NewClassedError returns a sentinel error of class that needs an
// operator, as NewError does.
func NewClassedError(class Class, text string) error { return &classed{sentinel{text}, class} }

type classed struct {
	sentinel
	class Class
}

func (e *classed) OperatorClass() Class { return e.class }
