package fresh

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"

	"github.com/walcount/walcount/internal/metrics"
)

const (
	// DefaultTimeout bounds a read that names no timeout, its min_lsn wait
	// included.
	DefaultTimeout = 5 * time.Second
	// MaxTimeout is the longest timeout a read may ask for.
	MaxTimeout = 30 * time.Second
)

// Handler serves GET /v1/counters/{counter}/{key} and GET
// /v1/counters/{counter}?keys=… (docs/fresh-reads.md).
func (r *Reader) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/counters/{counter}/{key}", r.serveOne)
	mux.HandleFunc("GET /v1/counters/{counter}", r.serveMany)
	return mux
}

// oneBody is the answer for one key.
type oneBody struct {
	Counter string          `json:"counter"`
	Key     string          `json:"key"`
	Value   json.RawMessage `json:"value"`
	Column  json.RawMessage `json:"column"`
	Pending json.RawMessage `json:"pending"`
	LSN     string          `json:"lsn"`
	Dirty   bool            `json:"dirty,omitempty"`
}

// manyBody is the answer for many keys: a key with no row and nothing
// pending has null.
type manyBody struct {
	Counter string                     `json:"counter"`
	LSN     string                     `json:"lsn"`
	Values  map[string]json.RawMessage `json:"values"`
	Dirty   []string                   `json:"dirty,omitempty"`
}

type errBody struct {
	Error   string `json:"error"`
	MinLSN  string `json:"min_lsn,omitempty"`
	Reached string `json:"lsn,omitempty"`
}

// jsonValue renders a figure: a number as it is, another text (an
// extremum of timestamps) as a string, nothing as null.
func jsonValue(s string) json.RawMessage {
	if s == "" {
		return json.RawMessage("null")
	}
	if json.Valid([]byte(s)) {
		if _, err := strconv.ParseFloat(s, 64); err == nil {
			return json.RawMessage(s)
		}
	}
	b, _ := json.Marshal(s)
	return b
}

// params reads min_lsn and timeout.
func params(req *http.Request) (min LSN, timeout time.Duration, err error) {
	q := req.URL.Query()
	timeout = DefaultTimeout
	if t := q.Get("timeout"); t != "" {
		if timeout, err = time.ParseDuration(t); err != nil || timeout <= 0 {
			return 0, 0, fmt.Errorf("timeout %q: want a duration such as 2s or 500ms", t)
		}
		if timeout > MaxTimeout {
			return 0, 0, fmt.Errorf("timeout %s: at most %s", timeout, MaxTimeout)
		}
	}
	if m := q.Get("min_lsn"); m != "" {
		if min, err = pglogrepl.ParseLSN(m); err != nil {
			return 0, 0, fmt.Errorf("min_lsn %q: want an LSN such as 0/16B3F20", m)
		}
	}
	return min, timeout, nil
}

func (r *Reader) serveOne(w http.ResponseWriter, req *http.Request) {
	name, key := req.PathValue("counter"), req.PathValue("key")
	snap, ok := r.serve(w, req, name, []string{key})
	if !ok {
		return
	}
	v := snap.Values[0]
	if !v.Found {
		r.opt.Metrics.FreshReads.WithLabelValues(metrics.ResultNotFound).Inc()
		writeJSON(w, http.StatusNotFound, errBody{Error: fmt.Sprintf("counter %s has no row and no pending delta for key %q", name, key), Reached: snap.LSN.String()})
		return
	}
	r.opt.Metrics.FreshReads.WithLabelValues(metrics.ResultOK).Inc()
	writeJSON(w, http.StatusOK, oneBody{Counter: name, Key: key, Value: jsonValue(v.Value), Column: jsonValue(v.Column),
		Pending: jsonValue(v.Pending), LSN: snap.LSN.String(), Dirty: v.Dirty})
}

func (r *Reader) serveMany(w http.ResponseWriter, req *http.Request) {
	name := req.PathValue("counter")
	raw := req.URL.Query().Get("keys")
	if raw == "" {
		r.opt.Metrics.FreshReads.WithLabelValues(metrics.ResultError).Inc()
		writeJSON(w, http.StatusBadRequest, errBody{Error: "keys: give the keys to read, comma-separated: ?keys=1,2,3"})
		return
	}
	var keys []string
	seen := map[string]bool{}
	for _, k := range strings.Split(raw, ",") {
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	if len(keys) > MaxKeys {
		r.opt.Metrics.FreshReads.WithLabelValues(metrics.ResultError).Inc()
		writeJSON(w, http.StatusBadRequest, errBody{Error: fmt.Sprintf("keys: %d keys, at most %d in one read", len(keys), MaxKeys)})
		return
	}
	snap, ok := r.serve(w, req, name, keys)
	if !ok {
		return
	}
	body := manyBody{Counter: name, LSN: snap.LSN.String(), Values: make(map[string]json.RawMessage, len(keys))}
	for _, v := range snap.Values {
		body.Values[v.Key] = json.RawMessage("null")
		if v.Found {
			body.Values[v.Key] = jsonValue(v.Value)
		}
		if v.Dirty {
			body.Dirty = append(body.Dirty, v.Key)
		}
	}
	r.opt.Metrics.FreshReads.WithLabelValues(metrics.ResultOK).Inc()
	writeJSON(w, http.StatusOK, body)
}

// serve runs a read and answers its errors; ok is false when it answered.
func (r *Reader) serve(w http.ResponseWriter, req *http.Request, name string, keys []string) (Snapshot, bool) {
	start := time.Now()
	defer func() { r.opt.Metrics.FreshReadSeconds.Observe(time.Since(start).Seconds()) }()
	min, timeout, err := params(req)
	if err != nil {
		r.opt.Metrics.FreshReads.WithLabelValues(metrics.ResultError).Inc()
		writeJSON(w, http.StatusBadRequest, errBody{Error: err.Error()})
		return Snapshot{}, false
	}
	ctx, cancel := context.WithTimeout(req.Context(), timeout)
	defer cancel()
	snap, err := r.Read(ctx, name, keys, min)
	if err == nil {
		return snap, true
	}
	var nr *NotReachedError
	var ne *NotExactError
	switch {
	case errors.As(err, &ne):
		r.opt.Metrics.FreshReads.WithLabelValues(metrics.ResultError).Inc()
		writeJSON(w, http.StatusUnprocessableEntity, errBody{Error: fmt.Sprintf("fresh reads of %s counters are not exact yet; read the column", ne.Kind)})
	case errors.As(err, &nr):
		r.opt.Metrics.FreshReads.WithLabelValues(metrics.ResultTimeout).Inc()
		writeJSON(w, http.StatusGatewayTimeout, errBody{Error: fmt.Sprintf("%v within %s", err, timeout), MinLSN: nr.Min.String(), Reached: nr.Reached.String()})
	case errors.Is(err, ErrUnknownCounter):
		r.opt.Metrics.FreshReads.WithLabelValues(metrics.ResultNotFound).Inc()
		writeJSON(w, http.StatusNotFound, errBody{Error: err.Error()})
	case errors.Is(err, ErrBadKey):
		r.opt.Metrics.FreshReads.WithLabelValues(metrics.ResultError).Inc()
		writeJSON(w, http.StatusBadRequest, errBody{Error: err.Error()})
	case errors.Is(err, ErrNotNow), ctx.Err() != nil:
		r.opt.Metrics.FreshReads.WithLabelValues(metrics.ResultUnavailable).Inc()
		writeJSON(w, http.StatusServiceUnavailable, errBody{Error: fmt.Sprintf("no consistent value within %s: %v", timeout, err)})
	default:
		r.opt.Metrics.FreshReads.WithLabelValues(metrics.ResultError).Inc()
		r.log.Warn("fresh read failed", zap.String("counter", name), zap.Error(err))
		writeJSON(w, http.StatusServiceUnavailable, errBody{Error: err.Error()})
	}
	return Snapshot{}, false
}

func writeJSON(w http.ResponseWriter, code int, body any) {
	b, err := json.Marshal(body)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"error":"encode the answer"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}
