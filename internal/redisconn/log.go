package redisconn

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/walcount/walcount/internal/redact"
)

// LogInterval is the least time between two warnings made of go-redis's
// log lines. While Redis is down go-redis logs every failed dial of every
// pool ("redis: connection pool: failed to dial after 5 attempts …"),
// several lines a second; one warning per outage says the same. Those in
// between go to the debug level, and the next warning counts them.
const LogInterval = 30 * time.Second

// logRouter is the logger go-redis writes through. go-redis has one
// logger for the whole process, so the router has one too: the zap logger
// of the last New or RouteLogs.
type logRouter struct {
	interval time.Duration
	now      func() time.Time

	mu         sync.Mutex
	log        *zap.Logger
	last       time.Time // when the last warning went out
	suppressed int       // lines since then
}

var (
	router      = &logRouter{interval: LogInterval, now: time.Now, log: zap.NewNop()}
	installOnce sync.Once
)

// RouteLogs sends go-redis's log lines, which it writes to stderr
// otherwise, to log: news of a failover at info, failures as at most one
// warning every LogInterval. It affects every go-redis client of the
// process.
func RouteLogs(log *zap.Logger) {
	router.setLogger(log)
	installOnce.Do(func() { redis.SetLogger(router) })
}

func (r *logRouter) setLogger(log *zap.Logger) {
	r.mu.Lock()
	r.log = log.With(zap.String("component", "redis-client"))
	r.mu.Unlock()
}

// informational are go-redis's lines that report a change, not a failure.
var informational = []string{"sentinel: selected ", "sentinel: new master", "sentinel: discovered new sentinel"}

// Printf implements go-redis's logging interface.
func (r *logRouter) Printf(_ context.Context, format string, v ...any) {
	msg := redact.URL(strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: "))
	for _, p := range informational {
		if strings.HasPrefix(msg, p) {
			r.mu.Lock()
			log := r.log
			r.mu.Unlock()
			log.Info("redis client: "+msg, zap.String("source", "go-redis"))
			return
		}
	}
	r.mu.Lock()
	log := r.log
	now := r.now()
	loud := r.last.IsZero() || now.Sub(r.last) >= r.interval
	n := r.suppressed
	if loud {
		r.last, r.suppressed = now, 0
	} else {
		r.suppressed++
	}
	r.mu.Unlock()
	if loud {
		fields := []zap.Field{zap.String("source", "go-redis")}
		if n > 0 {
			fields = append(fields, zap.Int("similar_lines_since_last_warning", n))
		}
		log.Warn("redis client: "+msg+fmt.Sprintf(" (further lines within %s go to the debug level)", r.interval), fields...)
		return
	}
	log.Debug("redis client: "+msg, zap.String("source", "go-redis"))
}
