package main

import (
	"testing"

	"github.com/walcount/walcount/internal/testenv"
)

// TestMain closes the shared test servers after the package's tests.
func TestMain(m *testing.M) { testenv.Main(m) }
