package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/term"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/internal/buildinfo"
)

// globalFlags are the settings every command shares (docs/design.md §6):
// one flag per entry of config.Settings, which load reads back.
type globalFlags struct {
	configPath string
}

func newRootCmd() *cobra.Command {
	g := &globalFlags{}
	root := &cobra.Command{
		Use:   "walcount",
		Short: "Keep counter-cache columns exact by following the PostgreSQL WAL",
		Long: `walcount reads inserts, deletes, updates and truncates of your source tables
from a logical replication slot, turns them into signed deltas, coalesces them
in Redis and applies them to counter columns such as posts.likes_count once
per flush interval: exactly once, with no application code.

Every setting comes from the first of: its flag, its environment variable
(WALCOUNT_ and the flag's name, e.g. WALCOUNT_HTTP_ADDR), the config file,
the default.

Exit status: 0 success, 1 a runtime problem (a restart may cure it), 2 what
only a person can fix: a usage or configuration error, a refused login, a
missing privilege, the state schema of a newer walcount; walcount reconcile
--dry-run exits 3 when it found drift.`,
		Version:       buildinfo.Get().Version,
		SilenceUsage:  true,
		SilenceErrors: true,
		// cobra reports an unknown subcommand of a root that cannot run
		// as a plain error (exit 1). A root that runs gets it in Args
		// instead, which makes it a usage error, like an unknown flag;
		// without arguments the root prints its help, as before.
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				// cobra's own "did you mean" suggestions, which its
				// error for an unknown command would carry.
				hint := ""
				if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
					hint = "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t") + "\n"
				}
				return usageError{fmt.Errorf("unknown command %q for %q; see walcount --help%s", args[0], cmd.CommandPath(), hint)}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	root.SuggestionsMinimumDistance = 2
	root.SetVersionTemplate(versionLine() + "\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	f := root.PersistentFlags()
	f.StringVar(&g.configPath, "config", "", settingHelp("config"))
	for _, s := range config.Settings {
		if s.Key != "" && !s.RunOnly && s.Command == "" {
			addSettingFlag(root, f, s)
		}
	}

	root.AddCommand(
		newRunCmd(g),
		newSetupCmd(g),
		newTeardownCmd(g),
		newCheckCmd(g),
		newStatusCmd(g),
		newReconcileCmd(g),
		newVersionCmd(),
		newHealthcheckCmd(g),
		newDemoCmd(g),
		newConfigCmd(g),
		newManCmd(),
	)
	for _, c := range root.Commands() {
		c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
		if c.Args == nil {
			c.Args = noArgs
		}
	}
	return root
}

// settingHelp is the help of a setting's flag: what it is, then its
// variable and config key, from config.Settings, so that the help cannot
// name a variable the loader does not read.
func settingHelp(flag string) string {
	s, ok := config.SettingByFlag(flag)
	if !ok {
		panic("flag --" + flag + " has no config.Setting")
	}
	// In the order they win, after the flag.
	src := "env " + s.Env
	if s.Key != "" {
		src += ", config " + s.Key
	}
	if s.Fallback != "" {
		src += ", env " + s.Fallback
	}
	return fmt.Sprintf("%s (%s; default %s)", s.Help, src, s.Default)
}

// addSettingFlag defines the flag of s on fs, of the setting's kind, and
// its shell completion (walcount completion SHELL) when the setting takes
// one of a fixed set of values. load reads it back.
func addSettingFlag(cmd *cobra.Command, fs *pflag.FlagSet, s config.Setting) {
	help := settingHelp(s.Flag)
	switch s.Kind() {
	case "duration":
		fs.Duration(s.Flag, 0, help)
	case "int":
		fs.Int(s.Flag, 0, help)
	case "bool":
		fs.Bool(s.Flag, false, help)
	default:
		fs.String(s.Flag, "", help)
	}
	if len(s.Values) > 0 {
		values := s.Values
		_ = cmd.RegisterFlagCompletionFunc(s.Flag, func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			return values, cobra.ShellCompDirectiveNoFileComp
		})
	}
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("%s takes no arguments, got %q", cmd.CommandPath(), args)}
	}
	return nil
}

// load builds the configuration from defaults, environment, file and the
// flags that were set on cmd.
func (g *globalFlags) load(cmd *cobra.Command) (config.Config, error) {
	ov := config.Overrides{}
	fl := cmd.Flags()
	fl.Visit(func(f *pflag.Flag) {
		if s, ok := config.SettingByFlag(f.Name); ok && s.Key != "" {
			ov[f.Name] = f.Value.String()
		}
	})
	path := g.configPath
	if !fl.Changed("config") {
		path = ""
	}
	return config.Load(path, os.LookupEnv, ov)
}

// newLogger returns the logger of format (config.LogFormatAuto, console
// or json) at level. auto is zap's console encoder when stderr is a
// terminal and JSON otherwise (docs/design.md §6).
//
// Errors that walcount expects (a refused start, a failed session) carry
// no stack trace: their message says what is wrong and what to do, and a
// trace of the logging call adds nothing but noise. Only a bug, logged at
// DPanic level or above, gets one.
func newLogger(level, format string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, usageError{fmt.Errorf("--log-level: %w", err)}
	}
	if format == "" || format == config.LogFormatAuto {
		format = config.LogFormatJSON
		if term.IsTerminal(int(os.Stderr.Fd())) {
			format = config.LogFormatConsole
		}
	}
	var cfg zap.Config
	switch format {
	case config.LogFormatConsole:
		cfg = zap.NewDevelopmentConfig()
		// Development mode makes DPanic panic; walcount never wants that.
		cfg.Development = false
		if term.IsTerminal(int(os.Stderr.Fd())) {
			cfg.EncoderConfig.EncodeLevel = zapcore.CapitalColorLevelEncoder
		}
	case config.LogFormatJSON:
		cfg = zap.NewProductionConfig()
		cfg.EncoderConfig.TimeKey = "ts"
		cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
		cfg.Sampling = nil
	default:
		return nil, usageError{fmt.Errorf("--log-format: %q is not one of auto, console, json", format)}
	}
	// Durations are logged as seconds, under keys ending in _seconds
	// (took_seconds, retry_in_seconds), in both formats.
	cfg.EncoderConfig.EncodeDuration = zapcore.SecondsDurationEncoder
	cfg.DisableStacktrace = true
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	return cfg.Build(zap.AddStacktrace(zapcore.DPanicLevel))
}
