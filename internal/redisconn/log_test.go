package redisconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestLogRouterOneWarningPerOutage feeds the router the lines go-redis
// writes while a server is down: one warning per LogInterval, the rest at
// debug, counted in the next warning, and passwords masked.
func TestLogRouterOneWarningPerOutage(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zapcore.DebugLevel)
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	r := &logRouter{interval: LogInterval, now: func() time.Time { return now }}
	r.setLogger(zap.New(core))
	dial := "redis: connection pool: failed to dial after %d attempts: %v"
	for i := range 50 {
		r.Printf(context.Background(), dial, 5, fmt.Errorf("dial tcp 127.0.0.1:%d: connect: connection refused", 7000+i))
		now = now.Add(100 * time.Millisecond)
	}
	warns := logs.FilterLevelExact(zapcore.WarnLevel).All()
	if len(warns) != 1 {
		t.Fatalf("%d warnings during a 5 s outage, want 1: %v", len(warns), warns)
	}
	if !strings.Contains(warns[0].Message, "failed to dial") || strings.HasPrefix(warns[0].Message, "redis client: redis:") {
		t.Errorf("warning = %q", warns[0].Message)
	}
	if n := logs.FilterLevelExact(zapcore.DebugLevel).Len(); n != 49 {
		t.Errorf("%d debug lines, want 49", n)
	}
	// The next outage, past the interval, warns again and counts the
	// lines that went to debug.
	now = now.Add(LogInterval)
	r.Printf(context.Background(), dial, 5, errors.New("connection refused"))
	warns = logs.FilterLevelExact(zapcore.WarnLevel).All()
	if len(warns) != 2 || warns[1].ContextMap()["similar_lines_since_last_warning"] != int64(49) {
		t.Errorf("second outage: %v", warns)
	}
	// News of a failover is not a failure and is not held back.
	r.Printf(context.Background(), "sentinel: new master=%q addr=%q", "walcount", "127.0.0.1:7001")
	if n := logs.FilterLevelExact(zapcore.InfoLevel).FilterMessageSnippet("new master").Len(); n != 1 {
		t.Errorf("%d info lines about the new master, want 1", n)
	}
	r.Printf(context.Background(), "redis: dial redis://u:%s@h:1 failed", secret)
	for _, e := range logs.All() {
		if strings.Contains(e.Message, secret) {
			t.Errorf("log line shows the password: %s", e.Message)
		}
	}
}

// TestRouteLogs: RouteLogs takes over go-redis's process-wide logger.
func TestRouteLogs(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	RouteLogs(zap.New(core))
	defer RouteLogs(zap.NewNop())
	// A client of a port nothing listens on makes go-redis log its
	// failed dials.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	o, err := Parse("redis://"+addr+"/0", TLSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rdb := New(o.WithTimeout(time.Second), nil)
	defer rdb.Close()
	if err := rdb.Ping(context.Background()).Err(); err == nil {
		t.Fatal("PING of a closed port succeeded")
	}
	if logs.FilterField(zap.String("source", "go-redis")).Len() == 0 {
		t.Errorf("no go-redis line reached zap: %v", logs.All())
	}
}

func TestStale(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	tests := []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"nil", ctx, nil, false},
		{"redis.Nil", ctx, redis.Nil, false},
		{"refused", ctx, refused, true},
		{"EOF", ctx, io.EOF, true},
		{"wrapped EOF", ctx, fmt.Errorf("apply deltas: %w", io.ErrUnexpectedEOF), true},
		{"caller cancelled", cancelled, refused, false},
		{"script error", ctx, redisErr("ERR WALCOUNT_CHAIN no meta"), false},
		{"cluster down", ctx, redisErr("CLUSTERDOWN The cluster is down"), true},
		{"read-only replica", ctx, redisErr("READONLY You can't write against a read only replica."), true},
	}
	for _, tt := range tests {
		if got := stale(tt.ctx, tt.err); got != tt.want {
			t.Errorf("%s: stale = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// redisErr is a reply error as go-redis returns it.
type redisErr string

func (e redisErr) Error() string { return string(e) }
func (redisErr) RedisError()     {}
