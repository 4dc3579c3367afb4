// Package buildinfo says what a walcount binary is: its version, the VCS
// revision it was built from, whether that tree was modified, and the Go
// version that built it. `walcount --version`, `walcount version`, the
// start-up log line and the walcount_build_info metric all read Get.
//
// A release build stamps the values in with the linker (goreleaser and the
// Dockerfile do):
//
//	go build -ldflags "-X github.com/walcount/walcount/internal/buildinfo.version=v1.2.3 \
//	    -X github.com/walcount/walcount/internal/buildinfo.revision=<commit> \
//	    -X github.com/walcount/walcount/internal/buildinfo.modified=false" ./cmd/walcount
//
// Without them, the values come from the Go build information
// (runtime/debug.ReadBuildInfo): a `go build` in a git clone records the
// commit and whether the tree was modified (unless -buildvcs=false; Go does
// not do it in a git worktree, whose .git is a file, which is why make
// build stamps the revision itself), and `go install
// github.com/walcount/walcount/cmd/walcount@v1.2.3` records the module
// version, whose pseudo-version names the commit.
package buildinfo

import (
	"fmt"
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
)

// Set with -ldflags -X (see the package comment); empty when not.
var (
	version  string
	revision string
	modified string // "true" or "false"
)

// Modified values: whether the tree a binary was built from had
// uncommitted changes.
const (
	ModifiedTrue    = "true"
	ModifiedFalse   = "false"
	ModifiedUnknown = "unknown"
)

// Info is what a binary says about itself.
type Info struct {
	// Version is the release version (v1.2.3), a Go pseudo-version, or
	// "dev" for a build that knows none.
	Version string
	// Revision is the full VCS commit hash, or "" when unknown. A
	// pseudo-version carries only a 12-digit prefix.
	Revision string
	// Modified is ModifiedTrue, ModifiedFalse or ModifiedUnknown.
	Modified string
	// GoVersion is the Go toolchain that built the binary (go1.26.8).
	GoVersion string
	// OS and Arch are runtime.GOOS and runtime.GOARCH.
	OS, Arch string
}

// Get returns the running binary's Info: what the linker stamped in, and
// for what it did not, the Go build information.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(version, revision, modified, bi)
}

// pseudoRevision matches the commit prefix at the end of a Go
// pseudo-version (v0.0.0-20261201094512-889f495c1d2e, possibly with
// +incompatible or +dirty after it).
var pseudoRevision = regexp.MustCompile(`-(?:0\.)?\d{14}-([0-9a-f]{12})(?:\+[a-z]+)*$`)

// resolve is Get with its inputs as arguments.
func resolve(ldVersion, ldRevision, ldModified string, bi *debug.BuildInfo) Info {
	in := Info{
		Version:   ldVersion,
		Revision:  ldRevision,
		Modified:  ModifiedUnknown,
		GoVersion: runtime.Version(),
		OS:        runtime.GOOS,
		Arch:      runtime.GOARCH,
	}
	stamped := false // the linker stamped a valid modified flag
	if b, err := strconv.ParseBool(ldModified); err == nil {
		in.Modified, stamped = strconv.FormatBool(b), true
	}
	if bi != nil {
		if bi.GoVersion != "" {
			in.GoVersion = bi.GoVersion
		}
		fromModule := bi.Main.Version != "" && bi.Main.Version != "(devel)"
		if in.Version == "" && fromModule {
			in.Version = bi.Main.Version
		}
		vcs := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				vcs = true
				if in.Revision == "" {
					in.Revision = s.Value
				}
			case "vcs.modified":
				if !stamped {
					in.Modified = s.Value
				}
			}
		}
		if !vcs && fromModule {
			// go install module@version: built from the module's zip,
			// which is the tagged or pseudo-versioned commit as is.
			if in.Revision == "" {
				if m := pseudoRevision.FindStringSubmatch(bi.Main.Version); m != nil {
					in.Revision = m[1]
				}
			}
			if !stamped {
				in.Modified = ModifiedFalse
			}
		}
	}
	if in.Version == "" {
		in.Version = "dev"
	}
	return in
}

// ShortRevision is the revision's first 12 characters (as in a Go
// pseudo-version), or "unknown".
func (in Info) ShortRevision() string {
	switch {
	case in.Revision == "":
		return "unknown"
	case len(in.Revision) > 12:
		return in.Revision[:12]
	}
	return in.Revision
}

// String is the version line: walcount v1.2.3 (revision 889f495c1d2e,
// modified, go1.26.8, linux/amd64). A tree known to be clean adds nothing;
// one of unknown state says "modified unknown".
func (in Info) String() string {
	mod := ""
	switch in.Modified {
	case ModifiedTrue:
		mod = ", modified"
	case ModifiedUnknown:
		mod = ", modified unknown"
	}
	return fmt.Sprintf("walcount %s (revision %s%s, %s, %s/%s)",
		in.Version, in.ShortRevision(), mod, in.GoVersion, in.OS, in.Arch)
}
