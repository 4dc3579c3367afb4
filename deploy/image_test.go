package deploy_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walcount/walcount/internal/testkit/testenv"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// envImageTest turns TestImage on. It needs a Docker engine with BuildKit
// (make test-image sets it; .ci/run starts a dockerd for it), so make test,
// which runs on machines without one, leaves it unset: the test then says
// it was not run. Set with no engine answering, the test fails.
const envImageTest = "WALCOUNT_TEST_IMAGE"

// imageAPIPort is the port the image's WALCOUNT_HTTP_ADDR names
// (0.0.0.0:9750, README's Docker section). The containers run with
// --network host, so it is the host's port too.
const imageAPIPort = 9750

// TestImage builds the image with make image BASE=local (no registry is
// needed) and runs it as a user would, on the test kit's throwaway
// PostgreSQL and Redis of this host (--network host):
//
//   - run: walcount setup, then the daemon with the image's defaults;
//     docker's HEALTHCHECK of the image turns healthy; the process runs as
//     nonroot (uid 65532) and listens on 0.0.0.0:9750; likes inserted and
//     deleted show up in posts.likes_count; --version and the image's
//     labels name this checkout's commit; the image holds no shell, and
//     its CA bundle and nonroot user are there.
//   - compose: docker-compose.yml's walcount-setup and walcount services,
//     run by Debian's docker-compose (v1) on the same image, with the
//     database and Redis URLs pointed at the test servers: what compose
//     runs of walcount (its command, its --http-addr) counts, healthy.
//
// What it does not run: the compose file's postgres, redis, prometheus and
// grafana services (their images cannot be pulled here), its network, and
// compose v2 (Debian has none; v1 refuses the top-level name key, which
// the test drops and passes as -p instead). See README's Docker section.
func TestImage(t *testing.T) {
	if os.Getenv(envImageTest) == "" {
		t.Skipf("NOT RUN: TestImage builds and runs the container image and needs a Docker engine with BuildKit; "+
			"run it with make test-image (%s=1), which .ci/run does after starting dockerd", envImageTest)
	}
	d := newDocker(t)
	tag := d.build(t)

	t.Run("run", func(t *testing.T) { testImageRun(t, d, tag) })
	t.Run("compose", func(t *testing.T) { testImageCompose(t, d, tag) })
}

// docker runs the docker client that DOCKER names (the Makefile's
// variable), default docker.
type docker struct {
	bin string
}

func newDocker(t *testing.T) docker {
	t.Helper()
	d := docker{bin: os.Getenv("DOCKER")}
	if d.bin == "" {
		d.bin = "docker"
	}
	out, err := exec.Command(d.bin, "version", "--format", "{{.Server.Version}}").CombinedOutput()
	if err != nil {
		t.Fatalf("%s=1 but no Docker engine answers (%s version: %v):\n%s\n"+
			"start one (.ci/run does: scripts/docker-engine.sh start) and set DOCKER_HOST to it", envImageTest, d.bin, err, out)
	}
	t.Logf("docker engine %s (client %s)", strings.TrimSpace(string(out)), d.bin)
	return d
}

// run runs the docker client and returns its stdout, failing the test on
// an error.
func (d docker) run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := d.try(args...)
	if err != nil {
		t.Fatalf("%s %s: %v", d.bin, strings.Join(args, " "), err)
	}
	return out
}

// try runs the docker client and returns its stdout, or an error with its
// stderr.
func (d docker) try(args ...string) (string, error) {
	cmd := exec.Command(d.bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%w\n%s%s", err, out, stderr.String())
	}
	return string(out), nil
}

// build runs make image BASE=local with a tag of its own and removes the
// image when the test ends.
func (d docker) build(t *testing.T) string {
	t.Helper()
	tag := fmt.Sprintf("test-image-%d", time.Now().UnixNano())
	start := time.Now()
	cmd := exec.Command("make", "-C", "..", "image", "BASE=local", "IMAGE_TAG="+tag, "DOCKER="+d.bin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make image BASE=local: %v\n%s", err, out)
	}
	image := "walcount:" + tag
	t.Cleanup(func() {
		if _, err := d.try("rmi", image); err != nil {
			t.Errorf("remove %s: %v", image, err)
		}
	})
	size := d.run(t, "image", "inspect", "--format", "{{.Size}}", image)
	n, _ := strconv.ParseInt(strings.TrimSpace(size), 10, 64)
	t.Logf("make image BASE=local: %s in %s, %.1f MB", image, time.Since(start).Round(time.Millisecond), float64(n)/1e6)
	return image
}

// servers starts a throwaway PostgreSQL and Redis on this host with the
// compose example's tables, and returns their URLs.
func imageServers(t *testing.T) (db, redis string) {
	t.Helper()
	pg := testenv.Postgres(t)
	r := testenv.Redis(t)
	sql, err := os.ReadFile("compose/init.sql")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, string(sql)); err != nil {
		t.Fatalf("deploy/compose/init.sql: %v", err)
	}
	return pg.URL(), r.URL()
}

// requireFreeAPIPort fails unless the image's API port is free on this
// host: with --network host the container listens on the host's.
func requireFreeAPIPort(t *testing.T) {
	t.Helper()
	l, err := net.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", imageAPIPort))
	if err != nil {
		t.Fatalf("port %d is taken on this host (%v): the containers run with --network host and listen on the image's 0.0.0.0:%d; "+
			"stop what listens there (ss -ltnp 'sport = %d')", imageAPIPort, err, imageAPIPort, imageAPIPort)
	}
	l.Close()
}

func testImageRun(t *testing.T, d docker, image string) {
	requireFreeAPIPort(t)
	db, redis := imageServers(t)
	env := []string{"-e", "WALCOUNT_DATABASE_URL=" + db, "-e", "WALCOUNT_REDIS_URL=" + redis}

	// The image's own settings, as built.
	var cfg struct {
		User         string
		Env          []string
		ExposedPorts map[string]struct{}
		Entrypoint   []string
		Cmd          []string
		Healthcheck  struct{ Test []string }
		Labels       map[string]string
	}
	inspectJSON(t, d, &cfg, "image", "inspect", "--format", "{{json .Config}}", image)
	if cfg.User != "nonroot:nonroot" {
		t.Errorf("the image runs as %q, want nonroot:nonroot", cfg.User)
	}
	if !slices.Contains(cfg.Env, fmt.Sprintf("WALCOUNT_HTTP_ADDR=0.0.0.0:%d", imageAPIPort)) {
		t.Errorf("the image's environment %q does not set WALCOUNT_HTTP_ADDR=0.0.0.0:%d", cfg.Env, imageAPIPort)
	}
	if _, ok := cfg.ExposedPorts[fmt.Sprintf("%d/tcp", imageAPIPort)]; !ok || len(cfg.ExposedPorts) != 1 {
		t.Errorf("the image exposes %v, want %d/tcp", cfg.ExposedPorts, imageAPIPort)
	}
	if !slices.Equal(cfg.Healthcheck.Test, []string{"CMD", "/walcount", "healthcheck"}) {
		t.Errorf("the image's HEALTHCHECK is %q", cfg.Healthcheck.Test)
	}
	checkImageFiles(t, d, image)

	// --version and the labels name this checkout.
	want := checkoutVersion(t)
	if got := d.run(t, "run", "--rm", image, "--version"); got != want {
		t.Errorf("docker run %s --version = %q, want %q", image, got, want)
	}
	if rev := gitOut(t, "rev-parse", "HEAD"); cfg.Labels["org.opencontainers.image.revision"] != rev {
		t.Errorf("label org.opencontainers.image.revision = %q, want %s", cfg.Labels["org.opencontainers.image.revision"], rev)
	}

	// setup, then the daemon with the image's entrypoint and command.
	if out, err := d.try(append(append([]string{"run", "--rm", "--network", "host"}, env...), image, "setup")...); err != nil {
		t.Fatalf("walcount setup in the image: %v", err)
	} else {
		t.Logf("walcount setup in the image:\n%s", out)
	}
	name := fmt.Sprintf("walcount-test-image-%d", time.Now().UnixNano())
	// The image's HEALTHCHECK (its command, timeout and retries) with a
	// shorter interval: docker runs the first check one interval after the
	// start, 30 s in the image.
	args := append([]string{"run", "-d", "--name", name, "--network", "host", "--health-interval", "1s"}, env...)
	d.run(t, append(args, image)...)
	t.Cleanup(func() { removeContainer(t, d, name) })

	checkContainer(t, d, name, db)
}

// checkContainer waits for the container's health check to pass, checks
// its user and its listening socket, and that it counts.
func checkContainer(t *testing.T, d docker, name, db string) {
	t.Helper()
	var state struct {
		Config struct {
			Healthcheck struct{ Test []string }
		}
		State struct {
			Status string
			Pid    int
			Health struct {
				Status string
				Log    []struct {
					ExitCode int
					Output   string
				}
			}
		}
	}
	if !wait.Until(90*time.Second, 500*time.Millisecond, func() bool {
		inspectJSON(t, d, &state, "container", "inspect", "--format", "{{json .}}", name)
		if state.State.Health.Status == "healthy" {
			return true
		}
		if state.State.Status != "running" {
			t.Fatalf("container %s is %s, not running", name, state.State.Status)
		}
		return false
	}) {
		t.Fatalf("container %s not healthy after 90 s: health %q, log %+v", name, state.State.Health.Status, state.State.Health.Log)
	}
	t.Logf("container %s healthy (docker's health check %q)", name, state.Config.Healthcheck.Test)
	if !slices.Equal(state.Config.Healthcheck.Test, []string{"CMD", "/walcount", "healthcheck"}) {
		t.Errorf("the container's health check runs %q, not the image's /walcount healthcheck", state.Config.Healthcheck.Test)
	}

	pid := state.State.Pid
	if uids := procStatusField(t, pid, "Uid"); !slices.Equal(uids, []string{"65532", "65532", "65532", "65532"}) {
		t.Errorf("walcount in the container runs with uids %v, want nonroot's 65532", uids)
	}
	if gids := procStatusField(t, pid, "Gid"); !slices.Equal(gids, []string{"65532", "65532", "65532", "65532"}) {
		t.Errorf("walcount in the container runs with gids %v, want nonroot's 65532", gids)
	}
	// Go listens on 0.0.0.0 with a dual-stack socket, [::] (IPv4 too),
	// where the kernel offers IPv6.
	if l := listeners(t, pid); len(l) != 1 || l[0] != fmt.Sprintf("0.0.0.0:%d", imageAPIPort) && l[0] != fmt.Sprintf("[::]:%d", imageAPIPort) {
		t.Errorf("walcount in the container listens on %v, want 0.0.0.0:%d (or [::]:%[2]d) only", l, imageAPIPort)
	}
	waitHTTP200(t, fmt.Sprintf("http://127.0.0.1:%d/readyz", imageAPIPort))

	// It counts: likes inserted and deleted by the app reach likes_count.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, q := range []string{
		"INSERT INTO likes (post_id, user_id) SELECT 1, g FROM generate_series(1, 5) g",
		"INSERT INTO likes (post_id, user_id) VALUES (2, 1), (2, 2), (3, 1)",
		"DELETE FROM likes WHERE post_id = 2 AND user_id = 2",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	want := map[int64]int64{1: 5, 2: 1, 3: 1, 4: 0}
	var got map[int64]int64
	deadline, _ := ctx.Deadline()
	if wait.Until(time.Until(deadline), 200*time.Millisecond, func() bool {
		got = map[int64]int64{}
		rows, err := conn.Query(ctx, "SELECT id, likes_count FROM posts WHERE id <= 4")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id, n int64
			if err := rows.Scan(&id, &n); err != nil {
				t.Fatal(err)
			}
			got[id] = n
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(got) == fmt.Sprint(want)
	}) {
		t.Logf("likes_count of posts 1-4: %v", got)
		return
	}
	t.Fatalf("likes_count of posts 1-4 is %v, want %v, after 2 minutes", got, want)
}

// removeContainer prints the container's log when the test failed, and
// removes it.
func removeContainer(t *testing.T, d docker, name string) {
	if t.Failed() {
		out, _ := exec.Command(d.bin, "logs", "--tail", "60", name).CombinedOutput()
		t.Logf("docker logs %s:\n%s", name, out)
	}
	if _, err := d.try("rm", "-f", name); err != nil {
		t.Errorf("remove container %s: %v", name, err)
	}
}

func inspectJSON(t *testing.T, d docker, v any, args ...string) {
	t.Helper()
	out := d.run(t, args...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// checkImageFiles reads the image's file system (docker export of a
// container made from it, never started): no shell, the nonroot user,
// the CA certificates, /tmp writable by all, nonroot's home.
func checkImageFiles(t *testing.T, d docker, image string) {
	t.Helper()
	id := strings.TrimSpace(d.run(t, "create", image))
	defer d.run(t, "rm", id)
	cmd := exec.Command(d.bin, "export", id)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	files := map[string]*tar.Header{}
	contents := map[string][]byte{}
	tr := tar.NewReader(out)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("docker export: %v", err)
		}
		name := "/" + strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		files[name] = h
		switch name {
		case "/etc/passwd", "/etc/group", "/etc/ssl/certs/ca-certificates.crt":
			if contents[name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("docker export: %v", err)
	}
	for _, sh := range []string{"/bin/sh", "/bin/bash", "/bin/busybox", "/usr/bin/sh"} {
		if _, ok := files[sh]; ok {
			t.Errorf("the image holds %s: it should hold no shell", sh)
		}
	}
	if h := files["/walcount"]; h == nil || h.Mode&0o111 == 0 || h.Uid != 0 {
		t.Errorf("/walcount in the image: %+v, want an executable owned by root", h)
	}
	if !strings.Contains(string(contents["/etc/passwd"]), "\nnonroot:x:65532:65532:") ||
		!strings.Contains(string(contents["/etc/group"]), "\nnonroot:x:65532:") {
		t.Errorf("the image has no nonroot user and group 65532:\n%s\n%s", contents["/etc/passwd"], contents["/etc/group"])
	}
	if !x509.NewCertPool().AppendCertsFromPEM(contents["/etc/ssl/certs/ca-certificates.crt"]) {
		t.Error("the image's /etc/ssl/certs/ca-certificates.crt holds no certificate")
	}
	if h := files["/tmp"]; h == nil || h.Typeflag != tar.TypeDir || h.FileInfo().Mode()&(os.ModeSticky|0o777) != os.ModeSticky|0o777 {
		t.Errorf("/tmp in the image: %+v, want a directory of mode 1777", h)
	}
	if h := files["/home/nonroot"]; h == nil || h.Typeflag != tar.TypeDir || h.Uid != 65532 || h.Gid != 65532 {
		t.Errorf("/home/nonroot in the image: %+v, want a directory owned by 65532:65532", h)
	}
}

// checkoutVersion is what `walcount --version` of an image that make image
// built from this checkout prints: the Makefile's version, revision and
// modified flag.
func checkoutVersion(t *testing.T) string {
	t.Helper()
	version := gitOut(t, "describe", "--tags", "--always", "--dirty")
	rev := gitOut(t, "rev-parse", "HEAD")
	mod := ""
	if gitOut(t, "status", "--porcelain") != "" {
		mod = "modified, "
	}
	return fmt.Sprintf("walcount %s (revision %s, %s%s, linux/%s)\n", version, rev[:12], mod, runtime.Version(), runtime.GOARCH)
}

func gitOut(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

// procStatusField returns the fields of a line of /proc/PID/status.
func procStatusField(t *testing.T, pid int, key string) []string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			return strings.Fields(v)
		}
	}
	t.Fatalf("/proc/%d/status has no %s line", pid, key)
	return nil
}

// listeners returns the TCP addresses process pid listens on: the
// sockets of its network namespace (/proc/PID/net/tcp and tcp6) in state
// LISTEN whose inode is one of its file descriptors. Reading another
// user's /proc/PID/fd needs root, as dockerd does.
func listeners(t *testing.T, pid int) []string {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	var out []string
	for _, file := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, file))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
			f := strings.Fields(sc.Text())
			if len(f) < 10 || f[3] != "0A" || !inodes[f[9]] {
				continue
			}
			out = append(out, procAddr(t, f[1]))
		}
		f.Close()
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// procAddr decodes an address of /proc/net/tcp (or tcp6): the IP as
// hexadecimal 32-bit words in host order (little-endian here), then the
// port.
func procAddr(t *testing.T, s string) string {
	t.Helper()
	hexIP, hexPort, _ := strings.Cut(s, ":")
	port, err := strconv.ParseUint(hexPort, 16, 16)
	if err != nil {
		t.Fatalf("address %q: %v", s, err)
	}
	ip := make(net.IP, len(hexIP)/2)
	for w := 0; w < len(ip)/4; w++ {
		v, err := strconv.ParseUint(hexIP[8*w:8*w+8], 16, 32)
		if err != nil {
			t.Fatalf("address %q: %v", s, err)
		}
		for i := range 4 {
			ip[4*w+i] = byte(v >> (8 * i))
		}
	}
	return net.JoinHostPort(ip.String(), strconv.FormatUint(port, 10))
}

// waitHTTP200 waits up to a minute for url to answer 200.
func waitHTTP200(t *testing.T, url string) {
	t.Helper()
	var err error
	if !wait.Until(time.Minute, 500*time.Millisecond, func() bool {
		var resp *http.Response
		resp, err = http.Get(url)
		if err != nil {
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return true
		}
		err = fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(body))
		return false
	}) {
		t.Fatalf("GET %s: %v", url, err)
	}
}

func testImageCompose(t *testing.T, d docker, image string) {
	compose, err := exec.LookPath("docker-compose")
	if err != nil {
		t.Fatalf("docker-compose is not installed (apt-get install docker-compose; .ci/run does): %v", err)
	}
	requireFreeAPIPort(t)
	db, redis := imageServers(t)
	project := fmt.Sprintf("walcounttest%d", time.Now().UnixNano())

	// The containers run on a network of their own, as compose runs
	// them, and reach the test servers, which listen on the host's
	// loopback, through forwarders on the network's gateway (the host's
	// side of the bridge), under the names postgres and redis.
	network := project + "_default"
	d.run(t, "network", "create", network)
	t.Cleanup(func() {
		if _, err := d.try("network", "rm", network); err != nil {
			t.Errorf("remove network %s: %v", network, err)
		}
	})
	gw := strings.TrimSpace(d.run(t, "network", "inspect", "--format", "{{range .IPAM.Config}}{{.Gateway}}{{end}}", network))
	if net.ParseIP(gw) == nil {
		t.Fatalf("network %s has gateway %q", network, gw)
	}
	dbURL := forwardURL(t, db, gw, "postgres")
	redisURL := forwardURL(t, redis, gw, "redis")

	// docker-compose.yml without its top-level name key, which compose v1
	// refuses (-p gives the project its name instead), and an override:
	// the test's image, the network, the test servers' URLs (the same
	// names as the compose file's, other ports), and a shorter health
	// check interval.
	b, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	dropped := 0
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(line, "name:") {
			dropped++
			continue
		}
		kept = append(kept, line)
	}
	if dropped != 1 {
		t.Fatalf("docker-compose.yml has %d top-level name keys, want 1", dropped)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "docker-compose.yml")
	if err := os.WriteFile(file, []byte(strings.Join(kept, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	override := filepath.Join(dir, "override.yml")
	var o strings.Builder
	fmt.Fprintf(&o, "networks:\n  default:\n    external: true\n    name: %q\nservices:\n", network)
	for _, s := range []string{"walcount-setup", "walcount"} {
		fmt.Fprintf(&o, "  %s:\n    image: %q\n    extra_hosts: [%q, %q]\n    environment:\n      WALCOUNT_DATABASE_URL: %q\n      WALCOUNT_REDIS_URL: %q\n",
			s, image, "postgres:"+gw, "redis:"+gw, dbURL, redisURL)
		if s == "walcount" {
			o.WriteString("    healthcheck:\n      interval: 1s\n")
		}
	}
	if err := os.WriteFile(override, []byte(o.String()), 0o644); err != nil {
		t.Fatal(err)
	}

	// composeCmd runs docker-compose and returns its stdout; its stderr
	// (progress, warnings) goes to the test log.
	composeCmd := func(args ...string) (string, error) {
		what := strings.Join(args, " ")
		args = append([]string{"-p", project, "--project-directory", "..", "-f", file, "-f", override}, args...)
		cmd := exec.Command(compose, args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if s := strings.TrimSpace(stderr.String()); s != "" {
			t.Logf("docker-compose %s (stderr):\n%s", what, s)
		}
		if err != nil {
			return string(out), fmt.Errorf("docker-compose %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}
	if out, err := composeCmd("version", "--short"); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("docker-compose %s", strings.TrimSpace(out))
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := composeCmd("logs", "--no-color", "--tail", "60")
			t.Logf("docker-compose logs:\n%s", out)
		}
		if _, err := composeCmd("down", "--volumes", "--remove-orphans", "--timeout", "10"); err != nil {
			t.Errorf("%v", err)
		}
	})

	// The one-shot setup service, then the daemon; --no-deps: postgres
	// and redis are the test's, not compose's.
	if out, err := composeCmd("run", "--rm", "-T", "--no-deps", "walcount-setup"); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("docker-compose run walcount-setup:\n%s", out)
	}
	if _, err := composeCmd("up", "-d", "--no-deps", "--no-build", "walcount"); err != nil {
		t.Fatal(err)
	}
	id, err := composeCmd("ps", "-q", "walcount")
	if err != nil {
		t.Fatal(err)
	}
	// The daemon listens on 0.0.0.0:9750 of its own network namespace
	// (the service's --http-addr), and the published port reaches it on
	// the host's loopback, and only there.
	checkContainer(t, d, strings.TrimSpace(id), db)
	if c, err := net.DialTimeout("tcp", net.JoinHostPort(gw, strconv.Itoa(imageAPIPort)), 2*time.Second); err == nil {
		c.Close()
		t.Errorf("port %d is published on %s too, not on 127.0.0.1 only", imageAPIPort, gw)
	}
}

// forwardURL forwards connections to host:port of the server at rawURL
// from an address on ip, until the test ends, and returns rawURL with its
// host replaced by name and the forwarder's port.
func forwardURL(t *testing.T, rawURL, ip, name string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatalf("listen on the network's gateway %s: %v", ip, err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { l.Close(); <-done })
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		defer wg.Wait()
		var conns []net.Conn
		var mu sync.Mutex
		defer func() {
			mu.Lock()
			for _, c := range conns {
				c.Close()
			}
			mu.Unlock()
		}()
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(out, in); out.Close() }()
			go func() { defer wg.Done(); io.Copy(in, out); in.Close() }()
		}
	}()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	u.Host = net.JoinHostPort(name, port)
	return u.String()
}
