package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/walcount/walcount/reconcile"
	"github.com/walcount/walcount/state"
)

func newReconcileCmd(g *globalFlags) *cobra.Command {
	var req reconcile.Request
	cmd := &cobra.Command{
		Use:   "reconcile",
		Short: "Compare the counters with COUNT(*)/SUM() and correct what drifted, while writes go on",
		Long: `walcount reconcile asks the running daemon (at --http-addr) to reconcile:
every key of every counter (or of --counter) is measured against the truth
without stopping writes, and keys that two measurements agree are off are
corrected through the stream, exactly once. --dry-run only reports them.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load(cmd)
			if err != nil {
				return err
			}
			if cfg.HTTPAddr == "" {
				return usageError{errors.New("walcount reconcile talks to the daemon over HTTP: set --http-addr")}
			}
			return runReconcile(cmd.Context(), cmd.OutOrStdout(), "http://"+cfg.HTTPAddr, req)
		},
	}
	cmd.Flags().StringVar(&req.Counter, "counter", "", "reconcile only this counter")
	cmd.Flags().BoolVar(&req.DryRun, "dry-run", false, "report drift, change nothing")
	cmd.Flags().IntVar(&req.BatchSize, "batch-size", 0, "keys per measurement (default: the daemon's reconcile.batch_size)")
	return cmd
}

func runReconcile(ctx context.Context, out io.Writer, base string, req reconcile.Request) error {
	body, _ := json.Marshal(req)
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/reconcile", bytes.NewReader(body))
	if err != nil {
		return err
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		return fmt.Errorf("no walcount daemon answers at %s (%v): start it with `walcount run` (reconciliation runs inside the daemon, which follows the stream)", base, err)
	}
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(data, &e)
		if e.Error == "" {
			e.Error = string(data)
		}
		return fmt.Errorf("daemon refused the reconciliation (%s): %s", resp.Status, e.Error)
	}
	var run reconcile.RunInfo
	if err := json.Unmarshal(data, &run); err != nil {
		return fmt.Errorf("read daemon answer: %w", err)
	}
	fmt.Fprintf(out, "reconciliation %d started (counters %v, dry run %v)\n", run.ID, run.Counters, run.DryRun)

	tty := false
	if f, ok := out.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	var bar *progressbar.ProgressBar
	lastLine := time.Time{}
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "\nstopped watching; the reconciliation goes on in the daemon")
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
		st, err := fetchReconcileStatus(ctx, base)
		if err != nil {
			return fmt.Errorf("follow reconciliation %d: %w", run.ID, err)
		}
		cur := st.Current
		if cur == nil || cur.ID != run.ID {
			if st.Last != nil && st.Last.ID == run.ID {
				if bar != nil {
					_ = bar.Finish()
					fmt.Fprintln(out)
				}
				return summarize(out, *st.Last, time.Since(start))
			}
			continue // still queued behind another run
		}
		if tty {
			if bar == nil && cur.Total > 0 {
				bar = progressbar.NewOptions64(cur.Total,
					progressbar.OptionSetWriter(out),
					progressbar.OptionSetDescription("keys checked"),
					progressbar.OptionShowCount(),
					progressbar.OptionSetPredictTime(true),
					progressbar.OptionShowElapsedTimeOnFinish(),
					progressbar.OptionThrottle(100*time.Millisecond))
			}
			if bar != nil {
				_ = bar.Set64(min(cur.KeysChecked, cur.Total))
			}
		} else if time.Since(lastLine) >= 5*time.Second {
			lastLine = time.Now()
			fmt.Fprintf(out, "checked %d/%d keys, %d drifted, %d corrected\n", cur.KeysChecked, cur.Total, cur.Drifted, cur.Corrected)
		}
	}
}

func fetchReconcileStatus(ctx context.Context, base string) (reconcile.Status, error) {
	raw, err := fetchDaemonStatus(ctx, base[len("http://"):])
	if err != nil {
		return reconcile.Status{}, err
	}
	var s struct {
		Reconcile reconcile.Status `json:"reconcile"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return reconcile.Status{}, fmt.Errorf("parse /status: %w", err)
	}
	return s.Reconcile, nil
}

func summarize(out io.Writer, r reconcile.RunInfo, took time.Duration) error {
	for _, d := range r.Drift {
		fmt.Fprintf(out, "drift: counter %s key %s cached %d true %d correction %+d\n", d.Counter, d.Key, d.Cached, d.True, d.Correction)
	}
	if int64(len(r.Drift)) < r.Drifted {
		fmt.Fprintf(out, "(%d more drifted keys in the daemon's log)\n", r.Drifted-int64(len(r.Drift)))
	}
	verb := "corrected"
	if r.DryRun {
		verb = "would correct (dry run)"
	}
	fmt.Fprintf(out, "reconciliation %d %s: %d keys checked, %d drifted, %d %s, in %s\n",
		r.ID, r.Status, r.KeysChecked, r.Drifted, map[bool]int64{true: r.Drifted, false: r.Corrected}[r.DryRun], verb, took.Round(time.Millisecond))
	if r.Status != state.StatusDone {
		return fmt.Errorf("reconciliation %d failed: %s", r.ID, r.Error)
	}
	return nil
}
