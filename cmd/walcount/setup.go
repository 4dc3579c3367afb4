package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"go.uber.org/zap"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/setup"
	"github.com/walcount/walcount/internal/connerr"
	"github.com/walcount/walcount/internal/redact"
	"github.com/walcount/walcount/internal/redisconn"
)

func connectPG(ctx context.Context, cfg config.Config) (*pgx.Conn, error) {
	conn, err := cfg.ConnectSQL(ctx)
	if err != nil {
		return nil, connerr.Postgres(err, cfg.DatabaseURL, cfg.OriginOf("database_url"))
	}
	return conn, nil
}

func newSetupCmd(g *globalFlags) *cobra.Command {
	var opt setup.Options
	cmd := &cobra.Command{
		Use:   "setup",
		Short: "Create the publication, the replication slot and walcount's state table (idempotent)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load(cmd)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			conn, err := connectPG(ctx, cfg)
			if err != nil {
				return err
			}
			defer conn.Close(context.Background())
			opt.Config = cfg
			opt.Out = cmd.OutOrStdout()
			opt.Waits = cmd.ErrOrStderr()
			if cfg.PooledSQL() && !opt.PrintSQL {
				// The slot is made on the direct connection, as it is read.
				// An SQL session: a replication=database in the URL is
				// for the stream, which walcount run opens itself.
				scfg, err := pgx.ParseConfig(cfg.ReplicationURL)
				if err != nil {
					return fmt.Errorf("parse the replication URL %s: %s", redact.URL(cfg.ReplicationURL), redact.URL(err.Error()))
				}
				delete(scfg.RuntimeParams, "replication")
				slotConn, err := pgx.ConnectConfig(ctx, scfg)
				if err != nil {
					return fmt.Errorf("connect to the replication URL %s: %s", redact.URL(cfg.ReplicationURL), redact.URL(err.Error()))
				}
				defer slotConn.Close(context.Background())
				opt.SlotConn = slotConn
			}
			res, err := setup.Run(ctx, conn, opt)
			if err != nil {
				return err
			}
			if opt.PrintSQL {
				return nil
			}
			out := cmd.OutOrStdout()
			for _, w := range res.Warnings {
				line := "warning: " + w.Message
				if w.Fix != "" {
					line += " — fix: " + w.Fix
				}
				fmt.Fprintln(out, line)
			}
			for _, t := range res.FixedIdentityTable {
				fmt.Fprintf(out, "set REPLICA IDENTITY FULL on %s\n", t)
			}
			if res.CreatedSlot {
				fmt.Fprintf(out, "created replication slot %q at %s\n", cfg.Slot, res.CheckpointLSN)
			} else {
				fmt.Fprintf(out, "replication slot %q exists; checkpoint at %s\n", cfg.Slot, res.CheckpointLSN)
			}
			fmt.Fprintf(out, "publication %q covers %s\n", cfg.Publication, strings.Join(res.Published, ", "))
			if res.NeedsReconcile {
				fmt.Fprintln(out, "the slot is new while a checkpoint existed: changes in between were not seen; every counter is marked dirty and walcount run reconciles it on its own")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&opt.PrintSQL, "print-sql", false, "print the SQL instead of running it")
	cmd.Flags().BoolVar(&opt.RecreateSlot, "recreate-slot", false, "drop and recreate the slot (after it was lost); every counter is marked dirty and walcount run repairs it")
	cmd.Flags().BoolVar(&opt.FixReplicaIdentity, "fix-replica-identity", false, "set REPLICA IDENTITY FULL on sources whose identity lacks a counter's columns")
	return cmd
}

func newTeardownCmd(g *globalFlags) *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "teardown",
		Short: "Drop the slot, the publication, walcount's schema and its Redis keys (with --yes; without, only lists them)",
		Long: `walcount teardown drops what walcount setup created: the replication slot, the
publication, the walcount schema (checkpoint, reconciliation runs, dirty
marks) and walcount's Redis keys. Without --yes it only lists what it would drop
and changes nothing; with --yes it drops them. The counter columns keep their
values.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load(cmd)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if !yes {
				fmt.Fprintln(out, "walcount teardown would drop:")
				for _, p := range setup.TeardownPlan(cfg.Slot, cfg.Publication) {
					fmt.Fprintln(out, "  -", p)
				}
				fmt.Fprintln(out, "run again with --yes to drop them")
				return nil
			}
			ctx := cmd.Context()
			conn, err := connectPG(ctx, cfg)
			if err != nil {
				return err
			}
			defer conn.Close(context.Background())
			ropt, err := cfg.RedisOptions()
			if err != nil {
				return &config.Error{Problems: []config.Problem{{Field: "redis_url", Msg: err.Error()}}}
			}
			// go-redis's lines about failed dials repeat the error
			// teardown returns; they do not go to stderr.
			rdb := redisconn.New(ropt, zap.NewNop())
			defer rdb.Close()
			res, err := setup.Teardown(ctx, conn, rdb, cfg.Slot, cfg.Publication)
			if err != nil {
				return err
			}
			if len(res.Dropped) > 0 {
				fmt.Fprintf(out, "dropped %s\n", strings.Join(res.Dropped, ", "))
			} else {
				fmt.Fprintln(out, "nothing to drop")
			}
			if len(res.ForOwner) > 0 {
				fmt.Fprintln(out, "left for their owner, who runs (psql -v ON_ERROR_STOP=1):")
				for _, stmt := range res.ForOwner {
					fmt.Fprintln(out, "  "+stmt)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "really drop")
	return cmd
}
