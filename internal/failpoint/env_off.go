//go:build !walcountfailpoints

package failpoint

// FromEnv returns nil: failpoints are armed from the environment only in
// binaries built with the walcountfailpoints tag (env_on.go), never in
// walcount's own.
func FromEnv() *Set { return nil }
