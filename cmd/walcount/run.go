package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/daemon"
	"github.com/walcount/walcount/app/preflight"
	"github.com/walcount/walcount/internal/buildinfo"
	"github.com/walcount/walcount/internal/failpoint"
	"github.com/walcount/walcount/internal/httpapi"
	"github.com/walcount/walcount/internal/metrics"
)

// httpCloseTimeout bounds the HTTP server's shutdown after the daemon stopped.
const httpCloseTimeout = 5 * time.Second

func newRunCmd(g *globalFlags) *cobra.Command {
	var skipCheck bool
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the daemon: follow the slot and keep the counters exact",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load(cmd)
			if err != nil {
				return err
			}
			log, err := newLogger(cfg.LogLevel, cfg.LogFormat)
			if err != nil {
				return err
			}
			defer log.Sync() //nolint:errcheck // stderr sync fails on terminals
			return runDaemon(cmd.Context(), cfg, log, skipCheck)
		},
	}
	cmd.Flags().BoolVar(&skipCheck, "skip-check", false, "start without the preflight checks of walcount check")
	for _, s := range config.Settings {
		if s.RunOnly {
			addSettingFlag(cmd, cmd.Flags(), s)
		}
	}
	return cmd
}

// runDaemon is walcount run: the preflight checks unless skipCheck, then the
// daemon and its HTTP server until ctx ends or the daemon stops on an error
// that needs an operator (a lost slot, a counter that cannot be attributed).
func runDaemon(ctx context.Context, cfg config.Config, log *zap.Logger, skipCheck bool) error {
	applyCPUScheduling(cfg.CPUScheduling, log)
	// New exports walcount_build_info from buildinfo.Get().
	m := metrics.New()
	d, err := daemon.New(daemon.Options{Config: cfg, Metrics: m, Logger: log,
		// nil but in the crash tests' build (the walcountfailpoints tag).
		Failpoints: failpoint.FromEnv()})
	if err != nil {
		return err
	}
	defer d.Close()
	if cfg.HTTPAddr != "" {
		srv := httpapi.New(httpapi.Options{
			Addr:      cfg.HTTPAddr,
			Metrics:   m,
			Status:    func(ctx context.Context) any { return d.Status(ctx) },
			Ready:     d.Ready,
			Reconcile: d.ReconcileHandler(),
			Counters:  d.FreshHandler(),
			Token:     cfg.HTTPToken,
			Logger:    log,
		})
		// Start logs the address it bound.
		if err := srv.Start(); err != nil {
			return fmt.Errorf("start http server: %w", err)
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), httpCloseTimeout)
			defer cancel()
			_ = srv.Close(sctx)
		}()
	}
	bi := buildinfo.Get()
	log.Info("walcount version", zap.String("version", bi.Version), zap.String("revision", bi.Revision),
		zap.String("modified", bi.Modified), zap.String("go_version", bi.GoVersion))
	if !skipCheck {
		// The slot is watched from the start, not only once the checks
		// pass: they may wait long for a server while the slot keeps WAL.
		stopWatch := d.WatchSlot(ctx)
		err := waitPreflight(ctx, cfg, log, d)
		stopWatch()
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			log.Info("walcount stopped cleanly")
			return nil
		}
	}
	if err := d.Run(ctx); err != nil {
		return err
	}
	log.Info("walcount stopped cleanly")
	return nil
}

// waitPreflight runs the preflight checks until they pass, refuse, or ctx
// ends. A PostgreSQL or Redis that does not answer yet (a server
// restarting, a Redis Cluster electing a new master) is no reason to exit:
// the checks are run again with the daemon's backoff, and meanwhile the
// daemon reports a failed start (/readyz answers 503 with the reason), as
// a session that fails mid-run would. Any other problem refuses at once.
func waitPreflight(ctx context.Context, cfg config.Config, log *zap.Logger, d *daemon.Daemon) error {
	backoff := daemon.DefaultRetryMin
	for {
		findings, err := runPreflight(ctx, cfg, log)
		var ref *preflight.Refusal
		unreachable := errors.As(err, &ref) && ref.Unreachable() || !errors.As(err, &ref) && preflight.Unreachable(err)
		if ctx.Err() != nil {
			// Stopped while the checks ran (SIGTERM): a clean stop,
			// not a failed check.
			return nil
		}
		if err == nil || !unreachable {
			logWarnings(findings, log)
			return err
		}
		d.StartFailed(err, backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, daemon.DefaultRetryMax)
	}
}

// runPreflight refuses to start rather than count wrongly (design rule
// 11): it runs walcount check's findings through the same gate as check
// and returns them with the *preflight.Refusal that lists every problem
// with its fix.
func runPreflight(ctx context.Context, cfg config.Config, log *zap.Logger) ([]preflight.Finding, error) {
	findings, err := preflight.Run(ctx, preflight.Options{Config: cfg, Logger: log, OwnerSQL: ownerSQL(cfg)})
	if err != nil {
		return findings, fmt.Errorf("preflight: %w", err)
	}
	return findings, preflight.Gate(findings)
}

// logWarnings logs the preflight's warnings.
func logWarnings(findings []preflight.Finding, log *zap.Logger) {
	for _, f := range findings {
		if f.Severity != preflight.Warning || f.Check == preflight.CheckSlotWALKeepSize {
			// The daemon reports max_slot_wal_keep_size itself at start,
			// with --skip-check too; once is enough.
			continue
		}
		log.Warn(f.Message, zap.String("check", f.Check), zap.String("fix", f.Fix))
	}
}
