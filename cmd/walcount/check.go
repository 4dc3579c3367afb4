package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/preflight"
	"github.com/walcount/walcount/app/setup"
)

func newCheckCmd(g *globalFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Check everything walcount run needs; print one line per finding with its fix",
		Long: `walcount check runs every check walcount run makes before it starts and prints
one line per finding (ok, warning, PROBLEM), each warning and problem with its
fix; a fix of several statements (what the tables' owner runs for a missing
publication or a new counter's table) goes on in indented lines. --json prints them as one JSON object instead:

  {"findings": [{"check": "wal_level", "severity": "ok", "message": "..."},
                {"check": "index", "severity": "warning", "message": "...", "fix": "..."},
                {"check": "slot", "severity": "problem", "cause": "setup", "message": "...", "fix": "..."}],
   "problems": 1, "warnings": 1, "exit_code": 1}

cause says what must change for a problem: "config" (walcount's
configuration), "setup" (walcount setup creates it), "access" (a grant, a
password or pg_hba.conf: walcount's role or Redis user may not do what it
needs) or "environment" (the database, Redis or the server settings). When check cannot run at all (no
PostgreSQL answers), --json prints {"error": "...", "exit_code": 1}.

Exit status: 0 no problem (warnings allowed), 1 a problem walcount run would
refuse to start with, 2 a problem only a person can fix: the configuration,
a grant or a login, or a state schema of a newer walcount.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load(cmd)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			findings, err := preflight.Run(cmd.Context(), preflight.Options{Config: cfg, OwnerSQL: ownerSQL(cfg)})
			if err != nil {
				if asJSON {
					writeCheckJSON(out, checkReport{Error: err.Error(), ExitCode: exitStatus(err)})
				}
				return err
			}
			// The same gate as run's: the exit code says what run would do.
			code := exitOK
			if err := preflight.Gate(findings); err != nil {
				code = exitStatus(err)
			}
			if asJSON {
				writeCheckJSON(out, newCheckReport(findings, code))
			} else {
				preflight.Format(out, findings)
			}
			if code != exitOK {
				return exitCodeError{code}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the findings as JSON")
	return cmd
}

// checkFinding is one finding in check --json.
type checkFinding struct {
	Check    string `json:"check"`
	Severity string `json:"severity"`
	Cause    string `json:"cause,omitempty"`
	Message  string `json:"message"`
	Fix      string `json:"fix,omitempty"`
}

// checkReport is check --json's output.
type checkReport struct {
	Findings []checkFinding `json:"findings,omitempty"`
	Problems int            `json:"problems"`
	Warnings int            `json:"warnings"`
	Error    string         `json:"error,omitempty"`
	ExitCode int            `json:"exit_code"`
}

func newCheckReport(findings []preflight.Finding, code int) checkReport {
	r := checkReport{Findings: []checkFinding{}, ExitCode: code}
	for _, f := range findings {
		cf := checkFinding{Check: f.Check, Severity: strings.ToLower(f.Severity.String()), Message: f.Message}
		if f.Severity != preflight.OK {
			cf.Fix = f.Fix
		}
		switch f.Severity {
		case preflight.Warning:
			r.Warnings++
		case preflight.Problem:
			r.Problems++
			cf.Cause = map[preflight.Cause]string{preflight.CauseConfig: "config", preflight.CauseSetup: "setup", preflight.CauseAccess: "access"}[f.Cause]
			if cf.Cause == "" {
				cf.Cause = "environment"
			}
		}
		r.Findings = append(r.Findings, cf)
	}
	return r
}

func writeCheckJSON(out io.Writer, r checkReport) {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	_ = enc.Encode(r)
}

// ownerSQL returns what walcount setup --print-sql --fix-replica-identity
// prints for cfg: every statement the owner of the tables runs for
// walcount's role: the fix, in check and in run's refusal alike, of a
// publication that needs the owner.
func ownerSQL(cfg config.Config) func(ctx context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		conn, err := connectPG(ctx, cfg)
		if err != nil {
			return "", err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		var out bytes.Buffer
		if _, err := setup.Run(ctx, conn, setup.Options{Config: cfg, PrintSQL: true, FixReplicaIdentity: true, Out: &out}); err != nil {
			return "", err
		}
		return out.String(), nil
	}
}
