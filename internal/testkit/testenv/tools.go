package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// ToolsCache is where make deps puts the tools it builds or extracts
// (promtool, helm, goreleaser): $WALCOUNT_TOOLS_CACHE, else
// /var/tmp/walcount/tools.
func ToolsCache() string {
	if d := os.Getenv("WALCOUNT_TOOLS_CACHE"); d != "" {
		return d
	}
	return "/var/tmp/walcount/tools"
}

// Promtool returns the path of the promtool binary: the one in PATH, else
// the one make deps extracted into the tools cache (a fresh machine has
// it only there).
func Promtool() (string, error) {
	if path, err := exec.LookPath("promtool"); err == nil {
		return path, nil
	}
	cached := filepath.Join(ToolsCache(), "bin", "promtool")
	if _, err := os.Stat(cached); err != nil {
		return "", fmt.Errorf("promtool is neither in PATH nor at %s: run make deps (scripts/ensure-deps.sh test), "+
			"which extracts it from Debian's prometheus package without installing that", cached)
	}
	return cached, nil
}
