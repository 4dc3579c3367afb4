package servers

import (
	"context"

	"go.uber.org/zap"
)

// Throwaway returns a function that starts a PostgreSQL (with settings on
// top of the defaults) and a Redis, and gives their URLs and what stops
// both: the shape of demo.Options.Servers, for make demo's entry point
// (cmd/demo) and the demo's tests. logger receives the
// servers' logs; nil means none.
func Throwaway(logger *zap.Logger) func(ctx context.Context, settings map[string]string) (dbURL, redisURL string, stop func(), err error) {
	return func(ctx context.Context, settings map[string]string) (string, string, func(), error) {
		pg, err := StartPostgres(ctx, PostgresOptions{Settings: settings, Logger: logger})
		if err != nil {
			return "", "", nil, err
		}
		rs, err := StartRedis(ctx, RedisOptions{Logger: logger})
		if err != nil {
			_ = pg.Close()
			return "", "", nil, err
		}
		return pg.URL(), rs.URL(), func() { _ = rs.Close(); _ = pg.Close() }, nil
	}
}
