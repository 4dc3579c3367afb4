package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/walcount/walcount/reconcile"
	"github.com/walcount/walcount/state"
)

// TestReconcileSaysWhoExecutedARunDoneAtOnce: a run sent to a standby that
// the active walcount finished before the first poll of its progress is
// still said to be executed there. Before, the end came first and the
// line was never printed (TestReconcileFollowsTheRun on a busy machine: a
// run of 2,000 keys done in 306 ms).
func TestReconcileSaysWhoExecutedARunDoneAtOnce(t *testing.T) {
	t.Parallel()
	run := reconcile.RunInfo{ID: 7, Kind: state.KindManual, Counters: []string{"post_likes"}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/reconcile", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(run)
	})
	mux.HandleFunc("GET /v1/reconcile/7", func(w http.ResponseWriter, r *http.Request) {
		done := run
		done.Status, done.KeysChecked, done.Total = state.StatusDone, 2000, 2000
		_ = json.NewEncoder(w).Encode(reconcile.RunView{RunInfo: done, ExecutedHere: false, Streaming: false})
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	var out bytes.Buffer
	addr := strings.TrimPrefix(srv.URL, "http://")
	if err := runReconcile(context.Background(), &out, daemonAPI{addr: addr}, reconcile.Request{}); err != nil {
		t.Fatalf("runReconcile: %v\n%s", err, out.String())
	}
	for _, want := range []string{"is executed by the walcount that streams from the slot", "does not stream (a standby waits for the slot)", " done: 2000 keys checked"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
