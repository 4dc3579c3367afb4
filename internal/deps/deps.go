// Package deps pins the module's dependencies while the packages that use
// them are being written. It is deleted once every dependency has a user.
package deps

import (
	_ "github.com/jackc/pglogrepl"
	_ "github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/common/expfmt"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/schollz/progressbar/v3"
	_ "github.com/spf13/cobra"
	_ "github.com/testcontainers/testcontainers-go"
	_ "go.uber.org/zap"
	_ "go.yaml.in/yaml/v3"
	_ "golang.org/x/sync/errgroup"
)
