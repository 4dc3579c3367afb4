package main

import (
	"fmt"
	"github.com/walcount/walcount/internal/buildinfo"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// newManCmd writes the man pages cobra generates from the commands' help.
func newManCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "man DIR",
		Short: "Write the man pages (walcount.1, walcount-run.1, ...) into DIR",
		Long: `walcount man writes one man page per command into DIR, made from the same
text as --help: walcount.1 for the command itself and walcount-<command>.1
for each subcommand. Install them where man looks, for example:

  walcount man /usr/local/share/man/man1 && man walcount-run`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("%s takes one argument, the directory to write the pages into", cmd.CommandPath())}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			root := cmd.Root()
			root.DisableAutoGenTag = true // no date: the pages are the same at every run
			header := &doc.GenManHeader{Title: "WALCOUNT", Section: "1", Source: "walcount " + buildinfo.Get().Version, Manual: "walcount manual"}
			if err := doc.GenManTree(root, header, dir); err != nil {
				return fmt.Errorf("write man pages into %s: %w", dir, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote the man pages into %s\n", dir)
			return nil
		},
	}
}
