package main

import (
	"os"
	"testing"

	"github.com/walcount/walcount/app/config"
	"github.com/walcount/walcount/internal/testkit/testenv"
)

// TestMain clears the variables walcount reads, so that a developer's shell
// cannot change what the tests see (tests that run in parallel cannot use
// t.Setenv), and closes the shared test servers after the package's tests.
func TestMain(m *testing.M) {
	for _, v := range []string{"DATABASE_URL", "REDIS_URL"} {
		os.Unsetenv(v)
	}
	for _, s := range config.Settings {
		os.Unsetenv(s.Env)
	}
	testenv.Main(m)
}
