package httpapi

import (
	"context"
	"io"
	"net/http"
)

// Reply is what a walcount's HTTP API answered to Get.
type Reply struct {
	// Code is the HTTP status code and Status its line ("200 OK").
	Code   int
	Status string
	// Body is the body, up to Get's limit.
	Body []byte
}

// Get sends GET path to the walcount listening at addr (host:port) and
// returns its answer, whatever its status, with at most limit bytes of
// the body. The error is the request's when there is no answer (nothing
// listens, ctx ended) or reading the body's.
func Get(ctx context.Context, addr, path string, limit int64) (Reply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return Reply{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Reply{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return Reply{}, err
	}
	return Reply{Code: resp.StatusCode, Status: resp.Status, Body: body}, nil
}
