package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/term"

	"github.com/walcount/walcount/internal/config"
)

// globalFlags are the settings every command shares (DESIGN §6).
type globalFlags struct {
	configPath    string
	databaseURL   string
	redisURL      string
	slot          string
	publication   string
	flushInterval time.Duration
	httpAddr      string
	logLevel      string
	cpuScheduling string // walcount run only
}

func newRootCmd() *cobra.Command {
	g := &globalFlags{}
	root := &cobra.Command{
		Use:   "walcount",
		Short: "Keep counter-cache columns exact by following the PostgreSQL WAL",
		Long: `walcount reads inserts, deletes, updates and truncates of your source tables
from a logical replication slot, turns them into signed deltas, coalesces them
in Redis and applies them to counter columns such as posts.likes_count once
per flush interval: exactly once, with no application code.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	f := root.PersistentFlags()
	f.StringVar(&g.configPath, "config", "", "YAML config file (env WALCOUNT_CONFIG)")
	f.StringVar(&g.databaseURL, "database-url", "", "PostgreSQL URL (env WALCOUNT_DATABASE_URL, DATABASE_URL; default "+config.DefaultDatabaseURL+")")
	f.StringVar(&g.redisURL, "redis-url", "", "Redis URL (env WALCOUNT_REDIS_URL, REDIS_URL; default "+config.DefaultRedisURL+")")
	f.StringVar(&g.slot, "slot", "", "logical replication slot (default "+config.DefaultSlot+")")
	f.StringVar(&g.publication, "publication", "", "publication (default "+config.DefaultPublication+")")
	f.DurationVar(&g.flushInterval, "flush-interval", 0, "how often deltas are applied to PostgreSQL (default 1s)")
	f.StringVar(&g.httpAddr, "http-addr", "", "HTTP listen address for /metrics, /healthz, /readyz, /status (default "+config.DefaultHTTPAddr+")")
	f.StringVar(&g.logLevel, "log-level", "", "debug, info, warn or error (default info)")

	root.AddCommand(
		newRunCmd(g),
		newSetupCmd(g),
		newTeardownCmd(g),
		newCheckCmd(g),
		newStatusCmd(g),
		newReconcileCmd(g),
		newVersionCmd(),
		newDemoCmd(g),
	)
	for _, c := range root.Commands() {
		c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
		if c.Args == nil {
			c.Args = noArgs
		}
	}
	return root
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
	if fl.Changed("log-level") {
		ov.LogLevel = &g.logLevel
	}
	if fl.Lookup("cpu-scheduling") != nil && fl.Changed("cpu-scheduling") {
		ov.CPUScheduling = &g.cpuScheduling
	}
	path := g.configPath
	if !fl.Changed("config") {
		path = ""
	}
	return config.Load(path, os.LookupEnv, ov)
}

// newLogger returns zap's JSON logger when stderr is not a terminal and a
// console logger when it is (DESIGN §6).
func newLogger(level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, usageError{fmt.Errorf("--log-level: %w", err)}
	}
	var cfg zap.Config
	if term.IsTerminal(int(os.Stderr.Fd())) {
		cfg = zap.NewDevelopmentConfig()
		cfg.EncoderConfig.EncodeLevel = zapcore.CapitalColorLevelEncoder
		cfg.DisableStacktrace = true
	} else {
		cfg = zap.NewProductionConfig()
		cfg.EncoderConfig.TimeKey = "ts"
		cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
		cfg.Sampling = nil
	}
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	return cfg.Build()
}
