// Command demo is make demo's entry point, for development only: it
// starts a throwaway PostgreSQL (wal_level=logical) and redis-server from
// the local binaries, runs the command it is given with --database-url
// and --redis-url naming them appended (make demo gives it bin/walcount
// demo and DEMO_FLAGS), stops both servers and exits with the command's
// status. It keeps the code that creates and starts servers out of the
// walcount binary, whose walcount demo takes the servers' URLs.
//
//	go run ./cmd/demo ./bin/walcount demo --duration 1m
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/walcount/walcount/app/demo"
	"github.com/walcount/walcount/internal/testkit/servers"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: go run ./cmd/demo WALCOUNT demo [FLAGS]")
		os.Exit(2)
	}
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	// A Ctrl-C reaches the command too (one process group): it ends its
	// load early and settles; this process waits for it, then stops the
	// servers.
	// Caught, not ignored: an ignored signal would stay ignored in the
	// command.
	signal.Notify(make(chan os.Signal, 1), os.Interrupt, syscall.SIGTERM)
	ctx := context.Background()
	fmt.Println("starting a throwaway PostgreSQL (wal_level=logical) and redis-server from the local binaries…")
	dbURL, redisURL, stop, err := servers.Throwaway(nil)(ctx, demo.PostgresSettings)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	defer stop()
	cmd := exec.Command(args[0], append(args[1:], "--database-url", dbURL, "--redis-url", redisURL)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode()
		}
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	return 0
}
