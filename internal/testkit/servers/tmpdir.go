package servers

import (
	"os"
	"sync"
	"syscall"
)

// EnvTempDir names the environment variable that chooses where servers
// create their temporary directories, overriding the tmpfs preference of
// TempRoot. Set it to /tmp to keep clusters on disk.
const EnvTempDir = "WALCOUNT_SERVERS_TMPDIR"

const (
	// shmDir is the tmpfs that TempRoot prefers.
	shmDir = "/dev/shm"
	// tmpfsMagic is statfs's f_type of a tmpfs.
	tmpfsMagic = 0x01021994
	// minShmFree is how much room a tmpfs must have left to be used: clusters
	// live in memory there, and WAL retained by a slot can grow.
	minShmFree = 4 << 30
)

// tempRoot reads EnvTempDir at every call, so that a program may move
// its later servers (the bench puts one section's clusters in memory);
// only the probe of the tmpfs is done once.
func tempRoot() string {
	if dir := os.Getenv(EnvTempDir); dir != "" {
		return dir
	}
	return defaultTempRoot()
}

var defaultTempRoot = sync.OnceValue(func() string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(shmDir, &st); err == nil && st.Type == tmpfsMagic &&
		st.Bavail*uint64(st.Bsize) >= minShmFree && writable(shmDir) {
		return shmDir
	}
	return os.TempDir()
})

// TempRoot returns the directory under which StartPostgres and StartRedis
// create their temporary directories: $WALCOUNT_SERVERS_TMPDIR if set, else
// /dev/shm when it is a tmpfs with at least 4 GiB free, else os.TempDir().
//
// A tmpfs is preferred for speed: creating a file on the disks of small
// virtual machines can take a millisecond, and a cluster holds about a
// thousand of them (a copy takes about 1 s on disk, 50 ms on tmpfs, and
// CREATE DATABASE about ten times longer). Durability is unaffected for
// walcount's purposes: fsync stays on, and everything a server wrote survives
// the death of any process (an immediate stop, SIGKILL); only a crash of the
// kernel itself, which no test performs, would lose it.
func TempRoot() string { return tempRoot() }

// writable reports whether this process may create files in dir.
func writable(dir string) bool {
	f, err := os.CreateTemp(dir, ".walcount-probe-")
	if err != nil {
		return false
	}
	f.Close()
	os.Remove(f.Name())
	return true
}
