package deploy_test

import (
	"net"
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// composeFile is the part of docker-compose.yml these tests read.
type composeFile struct {
	Services map[string]struct {
		Environment map[string]string `yaml:"environment"`
		Ports       []string          `yaml:"ports"`
	} `yaml:"services"`
}

// TestComposePublishesOnLoopbackOnly reads docker-compose.yml as YAML (make
// test runs without a Docker engine, and this machine has no compose v2 for
// `docker compose config`; TestImage runs the walcount services) and checks
// that every published port is bound to 127.0.0.1: the daemon's API
// includes POST /v1/reconcile, and PostgreSQL's password is a default.
func TestComposePublishesOnLoopbackOnly(t *testing.T) {
	b, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("docker-compose.yml is not valid YAML of the expected shape: %v", err)
	}
	w, ok := c.Services["walcount"]
	if !ok {
		t.Fatal("docker-compose.yml has no walcount service")
	}
	published := 0
	for name, s := range c.Services {
		for _, p := range s.Ports {
			published++
			// HOST_IP:HOST_PORT:CONTAINER_PORT (the host port may be a
			// ${VAR:-default}); without HOST_IP a port is published on
			// every interface of the host.
			host, rest, _ := strings.Cut(p, ":")
			if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() || !strings.Contains(rest, ":") {
				t.Errorf("service %s publishes %q: bind it to 127.0.0.1 (127.0.0.1:HOST:CONTAINER)", name, p)
			}
		}
	}
	if len(w.Ports) != 1 || !strings.HasSuffix(w.Ports[0], ":9750") {
		t.Errorf("walcount publishes %q, want its API port 9750 on loopback", w.Ports)
	}
	if published == 0 {
		t.Error("no service publishes a port: the test reads nothing")
	}
	// The token reaches the daemon when the operator sets it.
	if v, ok := w.Environment["WALCOUNT_HTTP_TOKEN"]; !ok || !strings.Contains(v, "${WALCOUNT_HTTP_TOKEN") {
		t.Errorf("the walcount service does not pass WALCOUNT_HTTP_TOKEN through: %q", v)
	}
}
