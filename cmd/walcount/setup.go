package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"go.uber.org/zap"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/setup"
	"github.com/walcount/walcount/counter"
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
			for _, t := range res.DroppedVia {
				fmt.Fprintf(out, "dropped %s: its counter is no longer configured\n", t)
			}
			if res.StaleSlot != "" {
				fmt.Fprintf(out, "did not adopt the existing slot: %s\n", res.StaleSlot)
				fmt.Fprintf(out, "dropped replication slot %q and created it anew at %s\n", cfg.Slot, res.CheckpointLSN)
			} else if res.CreatedSlot {
				fmt.Fprintf(out, "created replication slot %q at %s\n", cfg.Slot, res.CheckpointLSN)
			} else {
				fmt.Fprintf(out, "replication slot %q exists; checkpoint at %s\n", cfg.Slot, res.CheckpointLSN)
			}
			fmt.Fprintf(out, "publication %q covers %s\n", cfg.Publication, strings.Join(res.Published, ", "))
			if res.NeedsReconcile && res.StaleSlot != "" {
				fmt.Fprintln(out, "what the old slot's counts may hold is not known: every counter is marked dirty and walcount run reconciles it on its own")
			} else if res.NeedsReconcile {
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
	var yes, restoreIdentity bool
	cmd := &cobra.Command{
		Use:   "teardown",
		Short: "Drop the slot, the publication, walcount's schema and its Redis keys (with --yes; without, only lists them)",
		Long: `walcount teardown drops what walcount setup created: the replication slot, the
publication, the walcount schema (checkpoint, reconciliation runs, dirty
marks) and walcount's Redis keys. The slot is dropped where it lives: on
replication_url's server when that is set (a hot standby that decodes).
Without --yes it only lists what it would drop and changes nothing; with --yes
it drops them, then lists what it leaves on purpose with the statements that
remove it and who runs them: the counter columns and their values, the replica
identity setup set to FULL (restored with --restore-replica-identity when this
role owns the table), the privileges granted to walcount's role, and the role.
See docs/uninstall.md.`,
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
			topt := setup.TeardownOptions{Slot: cfg.Slot, Publication: cfg.Publication, Counters: cfg.Counters, RestoreIdentity: restoreIdentity}
			if len(topt.Counters) == 0 {
				topt.Counters = []counter.Counter{counter.Default()}
			}
			if cfg.SeparateSlotServer() {
				// The slot lives where the stream reads it: a hot standby
				// that decodes, or the primary behind a pooler.
				slotConn, err := cfg.ConnectSlotSQL(ctx)
				if err != nil {
					return fmt.Errorf("connect to the replication URL %s to drop the slot there: %s", redact.URL(cfg.ReplicationURL), redact.URL(err.Error()))
				}
				defer slotConn.Close(context.Background())
				topt.SlotConn, topt.SlotServer = slotConn, slotServer(ctx, slotConn)
			}
			res, err := setup.TeardownWith(ctx, conn, rdb, topt)
			if err != nil {
				return err
			}
			printTeardown(out, res)
			return nil
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "really drop")
	cmd.Flags().BoolVar(&restoreIdentity, "restore-replica-identity", false, "give each table whose replica identity setup set to FULL the identity it had (when this role owns it); without, the statements are printed")
	return cmd
}

// slotServer names the server of the slot connection for the operator:
// "the hot standby 10.0.0.2:5432" or "the primary 10.0.0.1:5432".
func slotServer(ctx context.Context, conn *pgx.Conn) string {
	kind := "the server"
	var standby bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&standby); err == nil {
		kind = "the primary"
		if standby {
			kind = "the hot standby"
		}
	}
	cc := conn.Config()
	return fmt.Sprintf("%s %s:%d (replication_url)", kind, cc.Host, cc.Port)
}

// printTeardown tells the operator what teardown dropped, restored and
// left, with the statements that remove what it left.
func printTeardown(out io.Writer, res setup.TeardownResult) {
	if len(res.Dropped) > 0 {
		fmt.Fprintf(out, "dropped %s\n", strings.Join(res.Dropped, ", "))
	} else {
		fmt.Fprintln(out, "nothing to drop")
	}
	for _, r := range res.Restored {
		fmt.Fprintf(out, "restored replica identity: %s\n", r)
	}
	if len(res.ForOwner) > 0 {
		fmt.Fprintln(out, "left for their owner, who runs (psql -v ON_ERROR_STOP=1):")
		for _, stmt := range res.ForOwner {
			fmt.Fprintln(out, "  "+stmt)
		}
	}
	if len(res.Kept) > 0 {
		fmt.Fprintln(out, "kept on purpose (docs/uninstall.md says when to remove each):")
		for _, k := range res.Kept {
			fmt.Fprintln(out, "  - "+k.What)
			if k.Who != "" && len(k.SQL) > 0 {
				fmt.Fprintf(out, "    to remove it, %s runs:\n", k.Who)
			}
			for _, stmt := range k.SQL {
				fmt.Fprintln(out, "      "+stmt)
			}
		}
	}
}
