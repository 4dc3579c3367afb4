package main

import (
	"github.com/spf13/cobra"

	"github.com/walcount/walcount/internal/preflight"
)

func newCheckCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "Check everything walcount run needs; print one line per finding with its fix",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load(cmd)
			if err != nil {
				return err
			}
			findings, err := preflight.Run(cmd.Context(), preflight.Options{Config: cfg})
			if err != nil {
				return err
			}
			preflight.Format(cmd.OutOrStdout(), findings)
			// The same gate as run's: the exit code says what run would do.
			if err := preflight.Gate(findings); err != nil {
				return exitCodeError{exitStatus(err)}
			}
			return nil
		},
	}
}
