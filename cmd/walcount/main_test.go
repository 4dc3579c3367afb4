package main

import (
	"os"
	"testing"

	"github.com/walcount/walcount/internal/testenv"
)

// TestMain clears the variables walcount reads, so that a developer's shell
// cannot change what the tests see (tests that run in parallel cannot use
// t.Setenv), and closes the shared test servers after the package's tests.
func TestMain(m *testing.M) {
	for _, v := range []string{"WALCOUNT_CONFIG", "WALCOUNT_DATABASE_URL", "DATABASE_URL", "WALCOUNT_REDIS_URL", "REDIS_URL"} {
		os.Unsetenv(v)
	}
	testenv.Main(m)
}
