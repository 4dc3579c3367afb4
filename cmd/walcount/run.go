package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/walcount/walcount/internal/daemon"
	"github.com/walcount/walcount/internal/httpapi"
	"github.com/walcount/walcount/internal/metrics"
	"github.com/walcount/walcount/internal/preflight"
)

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
			log, err := newLogger(cfg.LogLevel)
			if err != nil {
				return err
			}
			defer log.Sync() //nolint:errcheck // stderr sync fails on terminals
			ctx := cmd.Context()
			if !skipCheck {
				// Refuse to start rather than count wrongly (DESIGN §2
				// rule 11).
				findings, err := preflight.Run(ctx, preflight.Options{Config: cfg, Logger: log})
				if err != nil {
					return fmt.Errorf("preflight: %w", err)
				}
				for _, f := range findings {
					switch f.Severity {
					case preflight.Warning:
						log.Warn(f.Message, zap.String("check", f.Check), zap.String("fix", f.Fix))
					case preflight.Problem:
						log.Error(f.Message, zap.String("check", f.Check), zap.String("fix", f.Fix))
					}
				}
				if preflight.HasProblems(findings) {
					return errors.New("preflight found problems (listed above); run walcount check for details")
				}
			}
			m := metrics.New()
			d, err := daemon.New(daemon.Options{Config: cfg, Metrics: m, Logger: log})
			if err != nil {
				return err
			}
			defer d.Close()
			var srv *httpapi.Server
			if cfg.HTTPAddr != "" {
				srv = httpapi.New(httpapi.Options{
					Addr:    cfg.HTTPAddr,
					Metrics: m,
					Status:  func(ctx context.Context) any { return d.Status(ctx) },
					Ready:   d.Ready,
					Logger:  log,
				})
				if err := srv.Start(); err != nil {
					return fmt.Errorf("start http server: %w", err)
				}
				log.Info("http server listening", zap.String("addr", srv.Addr()))
				defer func() {
					sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					_ = srv.Close(sctx)
				}()
			}
			if err := d.Run(ctx); err != nil {
				return err
			}
			log.Info("walcount stopped cleanly")
			return nil
		},
	}
	cmd.Flags().BoolVar(&skipCheck, "skip-check", false, "start without the preflight checks of walcount check")
	return cmd
}
