package daemon

import "github.com/walcount/walcount/internal/connerr"

// statementPoolError is a session that failed because database_url reaches
// a connection pool in statement mode, which refuses walcount's
// transactions: walcount run's checks refuse that pool before it starts,
// and with --skip-check the daemon meets it at its first transaction. No
// retry can succeed, so it needs an operator.
type statementPoolError struct{ err error }

func (e *statementPoolError) Error() string {
	return "database_url reaches a connection pool in statement mode, which refuses the transactions every flush runs in: " +
		e.err.Error() + "; fix: " + connerr.StatementPoolingFix
}

func (e *statementPoolError) Unwrap() error       { return e.err }
func (e *statementPoolError) NeedsOperator() bool { return true }

// classifyPooling returns err as a *statementPoolError when a statement
// pool refused it, else err.
func classifyPooling(err error) error {
	if connerr.StatementPooling(err) {
		return &statementPoolError{err}
	}
	return err
}
