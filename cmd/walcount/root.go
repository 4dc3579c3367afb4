package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/term"

	"github.com/walcount/walcount/internal/buildinfo"
	"github.com/walcount/walcount/internal/config"
)

// globalFlags are the settings every command shares (docs/design.md §6).
type globalFlags struct {
	configPath     string
	databaseURL    string
	replicationURL string
	redisURL       string
	slot           string
	publication    string
	flushInterval  time.Duration
	httpAddr       string
	httpToken      string
	logLevel       string
	logFormat      string
	cpuScheduling  string // walcount run only
	onSlotLoss     string // walcount run only
	maxKeys        int    // walcount reconcile only
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

Exit status: 0 success, 1 a runtime problem, 2 a usage or configuration
error; walcount reconcile --dry-run exits 3 when it found drift.`,
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
	f.StringVar(&g.configPath, "config", "", settingHelp("config", "YAML config file"))
	f.StringVar(&g.databaseURL, "database-url", "", settingHelp("database-url", "PostgreSQL URL"))
	f.StringVar(&g.replicationURL, "replication-url", "", settingHelp("replication-url", "PostgreSQL URL of the replication connection (the slot), when the database URL goes through a pooler"))
	f.StringVar(&g.redisURL, "redis-url", "", settingHelp("redis-url", "Redis URL"))
	f.StringVar(&g.slot, "slot", "", settingHelp("slot", "logical replication slot"))
	f.StringVar(&g.publication, "publication", "", settingHelp("publication", "publication"))
	f.DurationVar(&g.flushInterval, "flush-interval", 0, settingHelp("flush-interval", "how often deltas are applied to PostgreSQL"))
	f.StringVar(&g.httpAddr, "http-addr", "", settingHelp("http-addr", "HTTP API address: run serves /metrics, /healthz, /readyz, /status and POST /v1/reconcile there; status and reconcile ask the daemon there"))
	f.StringVar(&g.httpToken, "http-token", "", settingHelp("http-token", "bearer token POST /v1/reconcile requires when set; prefer the variable, a command line is visible to other users"))
	f.StringVar(&g.logLevel, "log-level", "", settingHelp("log-level", "debug, info, warn or error"))
	f.StringVar(&g.logFormat, "log-format", "", settingHelp("log-format", "auto (console on a terminal, JSON otherwise), console or json"))

	// Shell completion (walcount completion SHELL) offers the values of
	// the settings that have a fixed set.
	fixed := func(values ...string) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			return values, cobra.ShellCompDirectiveNoFileComp
		}
	}
	_ = root.RegisterFlagCompletionFunc("log-level", fixed("debug", "info", "warn", "error"))
	_ = root.RegisterFlagCompletionFunc("log-format", fixed(config.LogFormatAuto, config.LogFormatConsole, config.LogFormatJSON))

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
func settingHelp(flag, what string) string {
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
	return fmt.Sprintf("%s (%s; default %s)", what, src, s.Default)
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
	var ov config.Overrides
	fl := cmd.Flags()
	if fl.Changed("database-url") {
		ov.DatabaseURL = &g.databaseURL
	}
	if fl.Changed("replication-url") {
		ov.ReplicationURL = &g.replicationURL
	}
	if fl.Changed("redis-url") {
		ov.RedisURL = &g.redisURL
	}
	if fl.Changed("slot") {
		ov.Slot = &g.slot
	}
	if fl.Changed("publication") {
		ov.Publication = &g.publication
	}
	if fl.Changed("flush-interval") {
		ov.FlushInterval = &g.flushInterval
	}
	if fl.Changed("http-addr") {
		ov.HTTPAddr = &g.httpAddr
	}
	if fl.Changed("http-token") {
		ov.HTTPToken = &g.httpToken
	}
	if fl.Changed("log-level") {
		ov.LogLevel = &g.logLevel
	}
	if fl.Changed("log-format") {
		ov.LogFormat = &g.logFormat
	}
	if fl.Lookup("cpu-scheduling") != nil && fl.Changed("cpu-scheduling") {
		ov.CPUScheduling = &g.cpuScheduling
	}
	if fl.Lookup("on-slot-loss") != nil && fl.Changed("on-slot-loss") {
		ov.OnSlotLoss = &g.onSlotLoss
	}
	if fl.Lookup("max-keys-per-second") != nil && fl.Changed("max-keys-per-second") {
		ov.MaxKeysPerSecond = &g.maxKeys
	}
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
