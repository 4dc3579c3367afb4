package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/walcount/walcount/internal/buildinfo"
)

// versionLine is what walcount version and walcount --version print: the
// version, revision, modified flag and Go version of internal/buildinfo.
func versionLine() string {
	return buildinfo.Get().String()
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, VCS revision and Go version (as walcount --version does)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), versionLine())
			return nil
		},
	}
}
