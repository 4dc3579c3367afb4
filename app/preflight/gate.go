package preflight

import (
	"fmt"
	"strings"

	"github.com/walcount/walcount/internal/operator"
)

// Refusal is the error Gate returns: the Problems that keep walcount from
// running. walcount check, setup and run all decide through Gate, so they
// can never disagree about a database.
type Refusal struct {
	Problems []Finding
}

// Gate returns a *Refusal listing every Problem among findings, or nil
// when there is none. Warnings never refuse.
func Gate(findings []Finding) error {
	var problems []Finding
	for _, f := range findings {
		if f.Severity == Problem {
			problems = append(problems, f)
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return &Refusal{Problems: problems}
}

// ConfigProblem reports whether a problem is one the configuration must
// fix (CauseConfig): the command then exits with the usage status, since
// no change to the database makes that configuration work.
func (r *Refusal) ConfigProblem() bool {
	for _, p := range r.Problems {
		if p.Cause == CauseConfig {
			return true
		}
	}
	return false
}

// OperatorClass is the refusal's class for the exit status: Config when
// the configuration must change, Privilege when a grant (or a login) must,
// and None otherwise (a runtime problem, exit 1).
func (r *Refusal) OperatorClass() operator.Class {
	if r.ConfigProblem() {
		return operator.Config
	}
	for _, p := range r.Problems {
		if p.Cause == CauseAccess {
			return operator.Privilege
		}
	}
	return operator.None
}

// Error lists the problems, one per line, each with its fix.
func (r *Refusal) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "preflight found %d problem", len(r.Problems))
	if len(r.Problems) != 1 {
		b.WriteString("s")
	}
	b.WriteString(" (walcount check lists every finding):")
	for _, p := range r.Problems {
		b.WriteString("\n  - " + p.Message)
		if p.Fix != "" {
			b.WriteString(" — fix: " + p.Fix)
		}
	}
	return b.String()
}
