package servers

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// ownerFile, in every temporary directory this package creates, names the
// process that created it, so that the directories of a process that died
// without Close can be removed by a later one.
const ownerFile = "walcount-owner"

// tempPrefixes are the name prefixes of the directories sweepStale may remove.
var tempPrefixes = []string{"walcount-pg-", "wcpgs-", "walcount-redis-"}

// sweepOnce runs sweepStale once per process.
var sweepOnce sync.Once

// makeTempDir creates a temporary directory under TempRoot() and records
// this process as its owner. The first call of a process also sweeps stale
// directories left by dead processes.
func makeTempDir(prefix string) (string, error) {
	sweepOnce.Do(func() { sweepStale(TempRoot()) })
	dir, err := os.MkdirTemp(TempRoot(), prefix)
	if err != nil {
		return "", fmt.Errorf("create temp dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(processIdentity(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("create temp dir: %w", err)
	}
	return dir, nil
}

// sweepStale removes the temporary directories under root whose owner
// process no longer exists (it was killed before it could call Close). A
// tmpfs root would otherwise leak memory with every such process.
func sweepStale(root string) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !hasAnyPrefix(e.Name(), tempPrefixes) {
			continue
		}
		dir := filepath.Join(root, e.Name())
		owner, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // not ours, or its creator has not written it yet
		}
		pid, _, _ := strings.Cut(string(owner), " ")
		n, err := strconv.Atoi(pid)
		if err != nil || processIdentity(n) == string(owner) {
			continue // still alive
		}
		if pm, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid")); err == nil {
			first, _, _ := strings.Cut(string(pm), "\n")
			if n, err := strconv.Atoi(strings.TrimSpace(first)); err == nil && processIdentity(n) != "" {
				continue // a postmaster survived its parent: leave its files alone
			}
		}
		_ = os.RemoveAll(dir)
	}
}

// processIdentity returns "<pid> <start time>" for a live process, or "" if
// there is none: the start time tells a reused pid from the original.
func processIdentity(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	// After the command name: state is field 3, start time field 22.
	fields := strings.Fields(s[i+1:])
	if len(fields) < 20 || fields[0] == "Z" {
		return ""
	}
	return strconv.Itoa(pid) + " " + fields[19]
}

// hasAnyPrefix reports whether s starts with one of the prefixes.
func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
