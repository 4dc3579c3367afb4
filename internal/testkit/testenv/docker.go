package testenv

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// Container images used when neither local binaries nor external servers
// are available.
const (
	postgresImage = "postgres:15"
	redisImage    = "redis:7"
	// dockerSocket is where a local Docker engine listens by default.
	dockerSocket = "/var/run/docker.sock"
	// dockerPingTimeout bounds the reachability check.
	dockerPingTimeout = 3 * time.Second
)

// dockerReachable reports, once per process, whether a Docker engine answers:
// the one DOCKER_HOST names, or the one on /var/run/docker.sock.
var dockerReachable = sync.OnceValue(func() bool {
	if os.Getenv("DOCKER_HOST") == "" && !pingDockerSocket(dockerSocket) {
		return false
	}
	return providerHealthy()
})

// pingDockerSocket sends GET /_ping to the engine on a Unix socket.
func pingDockerSocket(path string) bool {
	if _, err := os.Stat(path); err != nil {
		return false
	}
	client := &http.Client{
		Timeout: dockerPingTimeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", path)
			},
		},
	}
	resp, err := client.Get("http://docker/_ping")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// providerHealthy asks testcontainers whether its Docker provider is healthy.
// testcontainers may panic when no engine is configured: that means no.
func providerHealthy() (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	provider, err := testcontainers.ProviderDocker.GetProvider()
	if err != nil {
		return false
	}
	defer provider.Close()
	ctx, cancel := context.WithTimeout(context.Background(), dockerPingTimeout)
	defer cancel()
	return provider.Health(ctx) == nil
}

// startPostgresContainer runs postgres:15 with logical replication enabled
// and returns its admin URL and a function that removes it.
func startPostgresContainer(ctx context.Context) (string, func() error, error) {
	cmd := []string{"postgres"}
	for k, v := range sharedSettings {
		cmd = append(cmd, "-c", k+"="+v)
	}
	cmd = append(cmd, "-c", "wal_level=logical")
	ctr, err := testcontainers.Run(ctx, postgresImage,
		testcontainers.WithEnv(map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust"}),
		testcontainers.WithCmd(cmd...),
		testcontainers.WithExposedPorts("5432/tcp"),
		testcontainers.WithWaitStrategyAndDeadline(startTimeout,
			// The entrypoint starts a temporary server first: wait for the
			// second "ready" line, then for the port.
			wait.ForLog("database system is ready to accept connections").WithOccurrence(2),
			wait.ForListeningPort("5432/tcp"),
		),
	)
	if err != nil {
		if ctr != nil {
			_ = ctr.Terminate(context.Background())
		}
		return "", nil, fmt.Errorf("start %s container: %w", postgresImage, err)
	}
	hostPort, err := ctr.PortEndpoint(ctx, "5432/tcp", "")
	if err != nil {
		_ = ctr.Terminate(context.Background())
		return "", nil, fmt.Errorf("find %s container port: %w", postgresImage, err)
	}
	url := "postgres://postgres@" + hostPort + "/postgres?sslmode=disable"
	return url, func() error { return ctr.Terminate(context.Background()) }, nil
}

// startRedisContainer runs redis:7 without persistence and returns its URL
// and a function that removes it.
func startRedisContainer(ctx context.Context) (string, func() error, error) {
	ctr, err := testcontainers.Run(ctx, redisImage,
		testcontainers.WithCmd("redis-server", "--save", "", "--appendonly", "no"),
		testcontainers.WithExposedPorts("6379/tcp"),
		testcontainers.WithWaitStrategyAndDeadline(startTimeout,
			wait.ForLog("Ready to accept connections"),
			wait.ForListeningPort("6379/tcp"),
		),
	)
	if err != nil {
		if ctr != nil {
			_ = ctr.Terminate(context.Background())
		}
		return "", nil, fmt.Errorf("start %s container: %w", redisImage, err)
	}
	hostPort, err := ctr.PortEndpoint(ctx, "6379/tcp", "")
	if err != nil {
		_ = ctr.Terminate(context.Background())
		return "", nil, fmt.Errorf("find %s container port: %w", redisImage, err)
	}
	return "redis://" + hostPort + "/0", func() error { return ctr.Terminate(context.Background()) }, nil
}
