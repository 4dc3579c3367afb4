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

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/internal/httpapi"
	"github.com/walcount/walcount/reconcile"
	"github.com/walcount/walcount/state"
)

func newReconcileCmd(g *globalFlags) *cobra.Command {
	var req reconcile.Request
	cmd := &cobra.Command{
		Use:   "reconcile",
		Short: "Compare the counters with COUNT(*)/SUM() and correct what drifted, while writes go on",
		Long: `walcount reconcile asks the running daemon (at --http-addr, WALCOUNT_HTTP_ADDR
or the config's http_addr, as walcount run resolves it) to reconcile: every
key of every counter (or of --counter) is measured against the truth without
stopping writes, and keys that two measurements agree are off are corrected
through the stream, exactly once. --dry-run only reports them. When the
daemon requires a token, set WALCOUNT_HTTP_TOKEN (or --http-token).
--max-keys-per-second (WALCOUNT_MAX_KEYS_PER_SECOND, the config's
reconcile.max_keys_per_second) paces the run; unset, the daemon's own
limit applies.

Exit status:
  0  done: no drift, or every drifted key corrected
  1  the reconciliation could not run or failed (no daemon answers, ...)
  2  a usage or configuration error
  3  --dry-run found drift (nothing was changed)`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load(cmd)
			if err != nil {
				return err
			}
			if cfg.HTTPAddr == "" {
				return usageError{errors.New("walcount reconcile talks to the daemon over HTTP, and http_addr is empty: set --http-addr or WALCOUNT_HTTP_ADDR to the daemon's address")}
			}
			// The run keeps to --max-keys-per-second (which the loader
			// ranks above the variable and the file, and validates), else
			// to the limit this command's variable or file sets, else to
			// the daemon's.
			switch {
			case cmd.Flags().Changed("max-keys-per-second"):
				n := cfg.Reconcile.MaxKeysPerSecond
				req.MaxKeysPerSecond = &n
			case cfg.Reconcile.MaxKeysPerSecond > 0:
				n := cfg.Reconcile.MaxKeysPerSecond
				req.MaxKeysPerSecond = &n
			}
			return runReconcile(cmd.Context(), cmd.OutOrStdout(), daemonAPI{addr: cfg.HTTPAddr, token: cfg.HTTPToken}, req)
		},
	}
	cmd.Flags().StringVar(&req.Counter, "counter", "", "reconcile only this counter")
	cmd.Flags().BoolVar(&req.DryRun, "dry-run", false, "report drift, change nothing; exit 3 when there is drift")
	cmd.Flags().IntVar(&req.BatchSize, "batch-size", 0, "keys per measurement (default: the daemon's reconcile.batch_size)")
	for _, s := range config.Settings {
		if s.Command == "reconcile" {
			addSettingFlag(cmd, cmd.Flags(), s)
		}
	}
	return cmd
}

// daemonAPI is where the daemon's HTTP API listens and the token its POST
// requests need.
type daemonAPI struct {
	addr  string
	token string
}

// noDaemon says that nothing answers at addr and how to point walcount at
// the daemon.
func noDaemon(addr string, err error) error {
	return fmt.Errorf("no walcount daemon answers at %s (%v): start it with `walcount run`, or point at its address with --http-addr or WALCOUNT_HTTP_ADDR (reconciliation runs inside the daemon, which follows the stream)", addr, err)
}

func runReconcile(ctx context.Context, out io.Writer, api daemonAPI, req reconcile.Request) error {
	body, _ := json.Marshal(req)
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+api.addr+"/v1/reconcile", bytes.NewReader(body))
	if err != nil {
		return err
	}
	hreq.Header.Set("Content-Type", "application/json")
	if api.token != "" {
		hreq.Header.Set("Authorization", "Bearer "+api.token)
	}
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		return noDaemon(api.addr, err)
	}
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized {
		if api.token == "" {
			return fmt.Errorf("the daemon at %s requires a token: set WALCOUNT_HTTP_TOKEN (or --http-token) to its http_token", api.addr)
		}
		return fmt.Errorf("the daemon at %s refused the token: WALCOUNT_HTTP_TOKEN (or --http-token) differs from its http_token", api.addr)
	}
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
	// lostSince is when the daemon stopped answering, zero while it
	// answers; elsewhere is set once the run was said to run elsewhere.
	var lostSince time.Time
	elsewhere := false
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "\nstopped watching; the reconciliation goes on in the daemon")
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
		view, err := fetchRun(ctx, api.addr, run.ID)
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			// The daemon restarts, or stopped: the run is recorded in
			// PostgreSQL and the walcount that streams from the slot
			// resumes it. Wait for the daemon to answer again.
			if lostSince.IsZero() {
				lostSince = time.Now()
				fmt.Fprintf(out, "the daemon at %s does not answer (%v); reconciliation %d goes on: it is recorded in the database and the walcount that streams from the slot resumes it. Waiting for the daemon to answer again (Ctrl-C stops watching)\n",
					api.addr, err, run.ID)
			} else if time.Since(lostSince) > followGrace {
				return fmt.Errorf("stopped following reconciliation %d: the daemon at %s has not answered for %s (%v); the run goes on in the walcount that streams from the slot, and walcount status shows it when it ends",
					run.ID, api.addr, followGrace, err)
			}
			continue
		}
		if !lostSince.IsZero() {
			lostSince = time.Time{}
			fmt.Fprintf(out, "the daemon at %s answers again; following reconciliation %d\n", api.addr, run.ID)
		}
		cur := view.RunInfo
		// Said before the end too: a run another walcount executes may
		// be done by the first poll (it ended unsaid before).
		if !view.ExecutedHere && !elsewhere && (cur.Owner != "" || !view.Streaming) {
			elsewhere = true
			by := "the walcount that streams from the slot"
			if cur.Owner != "" {
				by += " (" + cur.Owner + ")"
			}
			why := ""
			if !view.Streaming {
				why = fmt.Sprintf(": the daemon at %s does not stream (a standby waits for the slot)", api.addr)
			}
			fmt.Fprintf(out, "reconciliation %d is executed by %s%s; following it\n", run.ID, by, why)
		}
		if cur.Status == state.StatusDone || cur.Status == state.StatusFailed {
			if bar != nil {
				_ = bar.Finish()
				fmt.Fprintln(out)
			}
			return summarize(out, cur, time.Since(start))
		}
		if cur.Status != state.StatusRunning {
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

// followGrace is how long walcount reconcile waits for a daemon that
// stopped answering while it follows a run (a restart) before it gives up
// watching; the run itself goes on.
const followGrace = 2 * time.Minute

// fetchRun reads GET /v1/reconcile/{id}: any walcount of the slot answers
// it, from its own view or from the slot's records.
func fetchRun(ctx context.Context, addr string, id int64) (reconcile.RunView, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	r, err := httpapi.Get(ctx, addr, fmt.Sprintf("/v1/reconcile/%d", id), 1<<20)
	if err != nil {
		return reconcile.RunView{}, err
	}
	if r.Code == http.StatusNotFound || r.Code == http.StatusMethodNotAllowed {
		// A daemon without GET /v1/reconcile/{id}: what /status shows.
		st, err := fetchReconcileStatus(ctx, addr)
		if err != nil {
			return reconcile.RunView{}, err
		}
		for _, r := range []*reconcile.RunInfo{st.Current, st.Last} {
			if r != nil && r.ID == id {
				return reconcile.RunView{RunInfo: *r, ExecutedHere: true, Streaming: true}, nil
			}
		}
		return reconcile.RunView{RunInfo: reconcile.RunInfo{ID: id, Status: state.StatusPending}, ExecutedHere: true, Streaming: true}, nil
	}
	if r.Code != http.StatusOK {
		return reconcile.RunView{}, fmt.Errorf("GET /v1/reconcile/%d: %s: %s", id, r.Status, bytes.TrimSpace(r.Body))
	}
	var v reconcile.RunView
	if err := json.Unmarshal(r.Body, &v); err != nil {
		return reconcile.RunView{}, fmt.Errorf("parse run %d: %w", id, err)
	}
	return v, nil
}

func fetchReconcileStatus(ctx context.Context, addr string) (reconcile.Status, error) {
	raw, err := fetchDaemonStatus(ctx, addr)
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
	if r.DryRun && r.Drifted > 0 {
		// The summary above is the whole answer; the status says it to
		// scripts.
		return exitCodeError{exitDrift}
	}
	return nil
}
