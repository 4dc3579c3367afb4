package buildinfo

import (
	"runtime"
	"runtime/debug"
	"testing"
)

const commit = "889f495c1d2e7a9be0c4b1d3f5a6e7c8d9e0f1a2"

func vcsBuild(mainVersion, modified string) *debug.BuildInfo {
	return &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/walcount/walcount", Version: mainVersion},
		Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: commit},
			{Key: "vcs.modified", Value: modified},
		},
	}
}

// TestResolve covers each way a binary is built: stamped by the linker
// (goreleaser, the Dockerfile), go build in a checkout, go install of a
// tag or a pseudo-version, and a build that knows nothing.
func TestResolve(t *testing.T) {
	tests := []struct {
		name                   string
		ldV, ldRev, ldMod      string
		bi                     *debug.BuildInfo
		version, rev, mod, goV string
		line                   string
	}{
		{
			name: "linker stamps win over the build info",
			ldV:  "v1.2.3", ldRev: "aaaabbbbccccddddeeeeffff0000111122223333", ldMod: "false",
			bi:      vcsBuild("v0.0.0-20261201094512-889f495c1d2e+dirty", "true"),
			version: "v1.2.3", rev: "aaaabbbbccccddddeeeeffff0000111122223333", mod: ModifiedFalse, goV: "go1.26.8",
			line: "walcount v1.2.3 (revision aaaabbbbcccc, go1.26.8, ",
		},
		{
			name: "version stamped, revision from the checkout",
			ldV:  "v1.2.3",
			bi:   vcsBuild("(devel)", "true"), version: "v1.2.3", rev: commit, mod: ModifiedTrue, goV: "go1.26.8",
			line: "walcount v1.2.3 (revision 889f495c1d2e, modified, go1.26.8, ",
		},
		{
			name:    "go build in a clean checkout",
			bi:      vcsBuild("v0.0.0-20261201094512-889f495c1d2e", "false"),
			version: "v0.0.0-20261201094512-889f495c1d2e", rev: commit, mod: ModifiedFalse, goV: "go1.26.8",
			line: "walcount v0.0.0-20261201094512-889f495c1d2e (revision 889f495c1d2e, go1.26.8, ",
		},
		{
			name:    "go build in a checkout with -buildvcs=false",
			bi:      &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			version: "dev", rev: "", mod: ModifiedUnknown, goV: "go1.26.8",
			line: "walcount dev (revision unknown, modified unknown, go1.26.8, ",
		},
		{
			name:    "go install of a tag",
			bi:      &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.4.0"}},
			version: "v1.4.0", rev: "", mod: ModifiedFalse, goV: "go1.26.8",
			line: "walcount v1.4.0 (revision unknown, go1.26.8, ",
		},
		{
			name:    "go install of a pseudo-version",
			bi:      &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.4.1-0.20261201094512-889f495c1d2e"}},
			version: "v1.4.1-0.20261201094512-889f495c1d2e", rev: "889f495c1d2e", mod: ModifiedFalse, goV: "go1.26.8",
			line: "walcount v1.4.1-0.20261201094512-889f495c1d2e (revision 889f495c1d2e, go1.26.8, ",
		},
		{
			name: "no build info", version: "dev", rev: "", mod: ModifiedUnknown, goV: runtime.Version(),
			line: "walcount dev (revision unknown, modified unknown, " + runtime.Version() + ", ",
		},
		{
			name: "a stamped modified flag that is not a boolean is ignored", ldMod: "maybe",
			bi:      vcsBuild("(devel)", "false"),
			version: "dev", rev: commit, mod: ModifiedFalse, goV: "go1.26.8",
			line: "walcount dev (revision 889f495c1d2e, go1.26.8, ",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := resolve(tt.ldV, tt.ldRev, tt.ldMod, tt.bi)
			if got.Version != tt.version || got.Revision != tt.rev || got.Modified != tt.mod || got.GoVersion != tt.goV {
				t.Errorf("resolve = %+v, want version %q revision %q modified %q go %q", got, tt.version, tt.rev, tt.mod, tt.goV)
			}
			want := tt.line + runtime.GOOS + "/" + runtime.GOARCH + ")"
			if s := got.String(); s != want {
				t.Errorf("String() = %q, want %q", s, want)
			}
		})
	}
}
