package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/app/demo"
)

// demoLogLevel keeps the daemon quiet under the live view unless
// --log-level asks for more.
const demoLogLevel = "warn"

func newDemoCmd(g *globalFlags) *cobra.Command {
	var opt demo.Options
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run walcount against the PostgreSQL and Redis you name under a like/unlike load, then verify every count",
		Long: `demo runs on the PostgreSQL (wal_level=logical) and Redis that --database-url
and --redis-url name (both required; only the flags count: DATABASE_URL and
friends in the environment are ignored, so the demo never runs against an
app's database by accident). make demo starts throwaway servers from the
local binaries and passes their URLs; the walcount binary carries no code
that starts servers.

It creates a demo schema (walcount_demo.posts and .likes), runs setup, starts
the daemon in this process and lets several clients like and unlike posts
(Zipf-distributed, plus one viral post). It shows a live view once a second;
at the end it stops the load, waits until walcount has applied every
committed change and compares every post's likes_count with COUNT(*). It
exits 1 if any post differs. It keeps to its own schema, slot and
publication, all named walcount_demo, and drops them at the end.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fl := cmd.Flags()
			if fl.Changed("database-url") {
				opt.DatabaseURL, _ = fl.GetString("database-url")
			}
			if fl.Changed("redis-url") {
				opt.RedisURL, _ = fl.GetString("redis-url")
			}
			if fl.Changed("flush-interval") {
				d, _ := fl.GetDuration("flush-interval")
				if d <= 0 {
					return usageError{errors.New("--flush-interval must be positive")}
				}
				opt.FlushInterval = d
			}
			if opt.DatabaseURL == "" || opt.RedisURL == "" {
				return usageError{errors.New("walcount demo needs --database-url and --redis-url (make demo starts throwaway servers and passes them)")}
			}
			if opt.Duration <= 0 || opt.Clients <= 0 || opt.Posts < 2 {
				return usageError{errors.New("--duration and --clients must be positive and --posts at least 2")}
			}
			level := demoLogLevel
			if fl.Changed("log-level") {
				level, _ = fl.GetString("log-level")
			}
			format := config.LogFormatAuto
			if fl.Changed("log-format") {
				format, _ = fl.GetString("log-format")
			}
			log, err := newLogger(level, format)
			if err != nil {
				return err
			}
			defer log.Sync() //nolint:errcheck // stderr sync fails on terminals
			opt.Logger = log
			out := cmd.OutOrStdout()
			opt.Out = out
			opt.Terminal = out == os.Stdout && term.IsTerminal(int(os.Stdout.Fd())) && os.Getenv("TERM") != "dumb"
			res, err := demo.Run(cmd.Context(), opt)
			if err != nil {
				return err
			}
			if !res.Exact() {
				return fmt.Errorf("demo: %d of %d posts have likes_count <> COUNT(*)", res.MismatchCount, res.Posts)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&opt.Duration, "duration", demo.DefaultDuration, "how long the load runs")
	f.IntVar(&opt.Clients, "clients", demo.DefaultClients, "concurrent app clients")
	f.IntVar(&opt.Posts, "posts", demo.DefaultPosts, "number of posts")
	return cmd
}
