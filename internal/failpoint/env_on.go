//go:build walcountfailpoints

package failpoint

import (
	"fmt"
	"os"
)

// EnvVar names the failpoint a binary built with the walcountfailpoints
// tag stops at: the crash tests of the real binary set it, wait for the
// line FromEnv's hook prints, and kill the process with SIGKILL there.
const EnvVar = "WALCOUNT_TEST_FAILPOINT"

// FromEnv returns a Set whose failpoint EnvVar names, if any, prints
// "failpoint <name> reached" on stderr and then blocks for good (until
// the test kills the process). Only in binaries built with the
// walcountfailpoints tag; see env_off.go.
func FromEnv() *Set {
	name := os.Getenv(EnvVar)
	if name == "" {
		return nil
	}
	s := &Set{}
	s.Arm(name, func() error {
		fmt.Fprintf(os.Stderr, "failpoint %s reached: waiting to be killed\n", name)
		select {}
	})
	return s
}
