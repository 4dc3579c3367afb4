package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/walcount/walcount/internal/config"
	"github.com/walcount/walcount/internal/redact"
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

// effectiveSettings lists every setting of cfg with its value as text,
// secrets masked, in the order of deploy/walcount.example.yaml.
func effectiveSettings(cfg config.Config) []configLine {
	str := strconv.Quote
	dur := func(d time.Duration) string { return d.String() }
	secret := func(v string) string {
		if v == "" {
			return `""`
		}
		return "xxxxx (set)"
	}
	interval := "24h0m0s (default)"
	if cfg.Reconcile.Interval != nil {
		interval = dur(*cfg.Reconcile.Interval)
	}
	counters := make([]string, len(cfg.Counters))
	for i, c := range cfg.Counters {
		counters[i] = c.Name
	}
	return []configLine{
		{"database_url", str(redact.URL(cfg.DatabaseURL))},
		{"replication_url", str(redact.URL(cfg.ReplicationURL))},
		{"redis_url", str(redact.URL(cfg.RedisURL))},
		{"redis_tls.ca_file", str(cfg.RedisTLS.CAFile)},
		{"redis_tls.cert_file", str(cfg.RedisTLS.CertFile)},
		{"redis_tls.key_file", str(cfg.RedisTLS.KeyFile)},
		{"redis_tls.server_name", str(cfg.RedisTLS.ServerName)},
		{"redis_tls.insecure_skip_verify", strconv.FormatBool(cfg.RedisTLS.InsecureSkipVerify)},
		{"redis_sentinel.username", str(cfg.RedisSentinel.Username)},
		{"redis_sentinel.password", secret(cfg.RedisSentinel.Password)},
		{"slot", cfg.Slot},
		{"publication", cfg.Publication},
		{"flush_interval", dur(cfg.FlushInterval)},
		{"heartbeat_interval", dur(cfg.HeartbeatInterval)},
		{"stream_timeout", dur(cfg.StreamTimeout)},
		{"flush_lock_time", dur(cfg.FlushLockTime)},
		{"http_addr", str(cfg.HTTPAddr)},
		{"http_token", secret(cfg.HTTPToken)},
		{"log_level", cfg.LogLevel},
		{"log_format", cfg.LogFormat},
		{"cpu_scheduling", cfg.CPUScheduling},
		{"on_slot_loss", cfg.OnSlotLoss},
		{"slot_monitor.poll_interval", dur(cfg.SlotSettings.PollInterval)},
		{"slot_monitor.max_lag_bytes", strconv.FormatInt(cfg.SlotSettings.MaxLagBytes, 10)},
		{"reconcile.batch_size", strconv.Itoa(cfg.Reconcile.BatchSize)},
		{"reconcile.interval", interval},
		{"reconcile.max_keys_per_second", strconv.Itoa(cfg.Reconcile.MaxKeysPerSecond)},
		{"counters", fmt.Sprintf("%d: %s", len(counters), strings.Join(counters, ", "))},
	}
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
