package reconcile

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
)

// Handler serves POST /v1/reconcile: it starts a run and answers 202 with
// the run as JSON; 409 while another run is in progress, 400 for a bad
// request, 503 when the daemon is not ready. Progress is in /status under
// "reconcile".
func (r *Reconciler) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
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

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
