package reconcile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// Handler serves POST /v1/reconcile: it starts a run and answers 202 with
// the run as JSON; 409 while another run is in progress, 400 for a bad
// request, 503 when the daemon is not ready. Progress is in /status under
// "reconcile". GET /v1/reconcile/{id} returns one run (see serveRun).
func (r *Reconciler) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodGet {
			r.serveRun(w, req)
			return
		}
		var body Request
		if req.Body != nil {
			data, err := io.ReadAll(io.LimitReader(req.Body, 1<<16))
			if err != nil {
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": "read body: " + err.Error()})
				return
			}
			if len(data) > 0 {
				dec := json.NewDecoder(bytes.NewReader(data))
				dec.DisallowUnknownFields()
				if err := dec.Decode(&body); err != nil {
					writeJSON(w, http.StatusBadRequest, map[string]string{"error": "bad request body: " + err.Error()})
					return
				}
			}
		}
		if body.BatchSize < 0 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "batch_size must not be negative"})
			return
		}
		if body.MaxKeysPerSecond != nil && *body.MaxKeysPerSecond < 0 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "max_keys_per_second must not be negative"})
			return
		}
		run, err := r.Start(req.Context(), body)
		switch {
		case err == nil:
			writeJSON(w, http.StatusAccepted, run)
		case errors.Is(err, ErrBusy):
			writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
		case errors.Is(err, ErrUnknownCounter), errors.Is(err, ErrBadRequest):
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		case errors.Is(err, ErrNotStreaming):
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		default:
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		}
	})
}

// serveRun serves GET /v1/reconcile/{id}: the run (a RunView), 404 when
// the slot has no such run.
func (r *Reconciler) serveRun(w http.ResponseWriter, req *http.Request) {
	id, err := strconv.ParseInt(req.PathValue("id"), 10, 64)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "the run id must be a number"})
		return
	}
	view, ok, err := r.Lookup(req.Context(), id)
	switch {
	case err != nil:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
	case !ok:
		writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("no reconciliation %d for this slot", id)})
	default:
		writeJSON(w, http.StatusOK, view)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
