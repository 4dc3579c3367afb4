package servers_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/walcount/walcount/internal/testkit/servers"
	"github.com/walcount/walcount/internal/testkit/wait"
)

// envLifetimeHelper makes the test binary act as the doomed parent of
// TestServersDieWithTheirParent.
const envLifetimeHelper = "WALCOUNT_SERVERS_LIFETIME_HELPER"

// TestServersDieWithTheirParent kills a process that started a cluster and a
// redis-server without closing them, and expects both servers to go away.
func TestServersDieWithTheirParent(t *testing.T) {
	if os.Getenv(envLifetimeHelper) == "1" {
		runLifetimeHelper()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestServersDieWithTheirParent$", "-test.count=1")
	cmd.Env = append(os.Environ(), envLifetimeHelper+"=1")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start helper: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})

	values := map[string]string{}
	sc := bufio.NewScanner(stdout)
	for len(values) < 4 && sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			values[k] = v
		}
	}
	if len(values) < 4 {
		t.Fatalf("helper printed %v, want PGPID, PGDIR, REDISPID and REDISDIR", values)
	}
	t.Cleanup(func() {
		os.RemoveAll(values["PGDIR"])
		os.RemoveAll(values["REDISDIR"])
	})
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill helper: %v", err)
	}
	_ = cmd.Wait()

	for _, name := range []string{"PGPID", "REDISPID"} {
		pid, err := strconv.Atoi(values[name])
		if err != nil {
			t.Fatalf("%s=%q: %v", name, values[name], err)
		}
		if !wait.Until(20*time.Second, 20*time.Millisecond, func() bool { return !processAlive(pid) }) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("%s %d still runs 20s after its parent died", name, pid)
		}
	}
}

// runLifetimeHelper starts the servers, reports them and waits to be killed.
func runLifetimeHelper() {
	ctx := context.Background()
	p, err := servers.StartPostgres(ctx, servers.PostgresOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	r, err := servers.StartRedis(ctx, servers.RedisOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("PGPID=%d\nPGDIR=%s\nREDISPID=%d\nREDISDIR=%s\n",
		p.PID(), strings.TrimSuffix(p.DataDir(), "/data"), r.PID(), strings.TrimSuffix(r.LogPath(), "/redis.log"))
	// The helper has nothing to wait for but its own death (the test
	// kills its parent and checks the servers die with it); the minute
	// only bounds a helper the test forgot.
	time.Sleep(time.Minute)
	os.Exit(1)
}

// processAlive reports whether pid names a process that is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
