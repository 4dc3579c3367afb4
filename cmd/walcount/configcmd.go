package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/walcount/walcount/app/config"
)

func newConfigCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "config",
		Short: "Print the effective settings and where each came from (flag, environment, file, default)",
		Long: `walcount config loads the settings as every other command does (flag, then
environment variable, then config file, then default) and prints each one
with where it came from. Passwords in URLs and secrets (http_token,
redis_sentinel.password) are masked. It connects to nothing.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load(cmd)
			if err != nil {
				return err
			}
			fileFrom := ""
			switch {
			case cfg.File == "":
			case cmd.Flags().Changed("config"):
				fileFrom = "flag --config"
			default:
				fileFrom = "environment variable " + config.EnvConfig
			}
			printConfig(cmd.OutOrStdout(), cfg, fileFrom)
			return nil
		},
	}
}

// configLine is one setting as walcount config prints it.
type configLine struct{ key, value string }

// effectiveSettings lists every setting of cfg (config.Table, in the order
// of deploy/walcount.example.yaml) with its value as text, secrets masked,
// then the counters.
func effectiveSettings(cfg config.Config) []configLine {
	var lines []configLine
	for _, s := range config.Table {
		if s.Key != "" {
			lines = append(lines, configLine{s.Key, s.Show(cfg)})
		}
	}
	counters := make([]string, len(cfg.Counters))
	for i, c := range cfg.Counters {
		counters[i] = c.Name
	}
	return append(lines, configLine{"counters", fmt.Sprintf("%d: %s", len(counters), strings.Join(counters, ", "))})
}

func printConfig(out io.Writer, cfg config.Config, fileFrom string) {
	if cfg.File == "" {
		fmt.Fprintln(out, "config file: none (--config or WALCOUNT_CONFIG names one)")
	} else {
		fmt.Fprintf(out, "config file: %s (from %s)\n", cfg.File, fileFrom)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SETTING\tVALUE\tFROM")
	for _, l := range effectiveSettings(cfg) {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", l.key, l.value, cfg.OriginOf(l.key))
	}
	_ = tw.Flush()
}
