//go:build release

// The release test runs goreleaser, which takes minutes the first time
// (building goreleaser itself, then walcount): it is behind the release
// build tag and runs once in CI through make test-release.

package deploy_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// yamlKey returns the value node of key in mapping node m, or nil.
func yamlKey(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

func yamlStrings(n *yaml.Node) []string {
	var out []string
	if n != nil {
		for _, c := range n.Content {
			out = append(out, c.Value)
		}
	}
	return out
}

// packagedFiles are the files the archive and both packages must hold
// (paths in the archive, then in the packages), beside the binary.
var (
	archiveFiles = []string{
		"walcount", "LICENSE", "README.md", "CHANGELOG.md",
		"deploy/systemd/walcount.service", "deploy/systemd/walcount.env",
		"deploy/prometheus/alerts.yml", "deploy/prometheus/postgres_exporter.yml", "deploy/grafana/walcount.json",
	}
	packageFiles = []string{
		"/usr/bin/walcount",
		"/usr/lib/systemd/system/walcount.service",
		"/etc/walcount/walcount.env",
		"/usr/share/walcount/prometheus/alerts.yml",
		"/usr/share/walcount/prometheus/postgres_exporter.yml",
		"/usr/share/walcount/grafana/walcount.json",
		"/usr/share/doc/walcount/README.md",
		"/usr/share/doc/walcount/CHANGELOG.md",
		"/usr/share/doc/walcount/LICENSE",
	}
)

// TestReleaseSnapshot runs `goreleaser release --snapshot` on a clone of
// HEAD (so it checks what is committed) with .goreleaser.yaml narrowed to linux/amd64 (the other three
// targets build the same way; the full configuration is checked to name
// all four) and checks what it made: the checksums, the archive's files and
// the binary in it (its --version names the commit), the .deb's files,
// owners, modes, conffiles and maintainer scripts through dpkg-deb, and its
// binary too, and the .rpm's file list and attributes from its header.
func TestReleaseSnapshot(t *testing.T) {
	goreleaser := goTool(t, "goreleaser")
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Fatalf("dpkg-deb is not installed (apt-get install dpkg): %v", err)
	}

	// A clone of HEAD: a clean tree with a remote, as goreleaser wants.
	tmp := t.TempDir()
	top := strings.TrimSpace(run(t, ".", "git", "rev-parse", "--show-toplevel"))
	head := strings.TrimSpace(run(t, top, "git", "rev-parse", "HEAD"))
	clone := filepath.Join(tmp, "walcount")
	run(t, top, "git", "clone", "--quiet", "--shared", "--no-checkout", top, clone)
	run(t, clone, "git", "checkout", "--quiet", "--detach", head)

	b, err := os.ReadFile(filepath.Join(clone, ".goreleaser.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf(".goreleaser.yaml: %v", err)
	}
	root := doc.Content[0]
	builds := yamlKey(root, "builds")
	if builds == nil || len(builds.Content) != 1 {
		t.Fatal(".goreleaser.yaml: want one build")
	}
	build := builds.Content[0]
	if goos, goarch := yamlStrings(yamlKey(build, "goos")), yamlStrings(yamlKey(build, "goarch")); !slices.Equal(goos, []string{"linux", "darwin"}) ||
		!slices.Equal(goarch, []string{"amd64", "arm64"}) {
		t.Errorf(".goreleaser.yaml builds for %v x %v, want linux, darwin x amd64, arm64", goos, goarch)
	}
	if env := yamlStrings(yamlKey(build, "env")); !slices.Contains(env, "CGO_ENABLED=0") {
		t.Errorf(".goreleaser.yaml build env %v: want CGO_ENABLED=0 (static binaries)", env)
	}
	yamlKey(build, "goos").Content = []*yaml.Node{{Kind: yaml.ScalarNode, Value: "linux"}}
	yamlKey(build, "goarch").Content = []*yaml.Node{{Kind: yaml.ScalarNode, Value: "amd64"}}
	dist := filepath.Join(tmp, "dist")
	root.Content = append(root.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "dist"}, &yaml.Node{Kind: yaml.ScalarNode, Value: dist})
	narrowed, err := yaml.Marshal(&doc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(tmp, "goreleaser.yaml")
	if err := os.WriteFile(cfg, narrowed, 0o644); err != nil {
		t.Fatal(err)
	}

	out := run(t, clone, goreleaser, "release", "--snapshot", "--clean", "--config", cfg)
	t.Logf("goreleaser:\n%s", out)

	// The checksums cover every artefact and match.
	sums := run(t, dist, "cat", "checksums.txt")
	var archive, deb, rpm string
	for line := range strings.SplitSeq(strings.TrimSpace(sums), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("checksums.txt line %q", line)
		}
		data, err := os.ReadFile(filepath.Join(dist, name))
		if err != nil {
			t.Fatal(err)
		}
		if h := sha256.Sum256(data); hex.EncodeToString(h[:]) != sum {
			t.Errorf("checksums.txt: %s has sha256 %x, listed as %s", name, h, sum)
		}
		switch {
		case strings.HasSuffix(name, "_linux_amd64.tar.gz"):
			archive = name
		case strings.HasSuffix(name, ".deb"):
			deb = name
		case strings.HasSuffix(name, ".rpm"):
			rpm = name
		}
	}
	if archive == "" || deb == "" || rpm == "" {
		t.Fatalf("checksums.txt lists no linux/amd64 archive, .deb or .rpm:\n%s", sums)
	}
	wantVersion := func(where, bin string) {
		t.Helper()
		v := strings.TrimSpace(run(t, ".", bin, "--version"))
		t.Logf("%s: %s", where, v)
		if !strings.HasPrefix(v, "walcount v0.0.0-snapshot+") || !strings.Contains(v, "(revision "+head[:12]+", go") {
			t.Errorf("%s: walcount --version says %q, want the snapshot version and revision %s, not modified", where, v, head[:12])
		}
	}

	// The archive.
	files := untar(t, filepath.Join(dist, archive), filepath.Join(tmp, "archive"))
	if !slices.Equal(slices.Sorted(slices.Values(files)), slices.Sorted(slices.Values(archiveFiles))) {
		t.Errorf("%s holds %q, want %q", archive, files, archiveFiles)
	}
	wantVersion(archive, filepath.Join(tmp, "archive", "walcount"))
	unit, err := os.ReadFile(filepath.Join(clone, "deploy/systemd/walcount.service"))
	if err != nil {
		t.Fatal(err)
	}

	// The .deb, read by dpkg-deb.
	debPath := filepath.Join(dist, deb)
	listing := run(t, ".", "dpkg-deb", "--contents", debPath)
	entries := map[string]string{} // path -> "mode owner/group"
	for line := range strings.SplitSeq(strings.TrimSpace(listing), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		entries[strings.TrimPrefix(f[len(f)-1], ".")] = f[0] + " " + f[1]
	}
	for _, p := range packageFiles {
		if _, ok := entries[p]; !ok {
			t.Errorf("%s has no %s:\n%s", deb, p, listing)
		}
	}
	for p, want := range map[string]string{
		"/usr/bin/walcount":                        "-rwxr-xr-x root/root",
		"/usr/lib/systemd/system/walcount.service": "-rw-r--r-- root/root",
		"/etc/walcount/walcount.env":               "-rw-r----- root/walcount",
	} {
		if got := entries[p]; got != want {
			t.Errorf("%s: %s is %q, want %q", deb, p, got, want)
		}
	}
	control := filepath.Join(tmp, "deb-control")
	run(t, ".", "dpkg-deb", "--control", debPath, control)
	if c, _ := os.ReadFile(filepath.Join(control, "conffiles")); strings.TrimSpace(string(c)) != "/etc/walcount/walcount.env" {
		t.Errorf("%s conffiles %q, want /etc/walcount/walcount.env", deb, c)
	}
	for script, says := range map[string]string{"preinst": "useradd --system --gid walcount", "postinst": "daemon-reload", "prerm": "systemctl stop walcount.service", "postrm": "daemon-reload"} {
		if c, err := os.ReadFile(filepath.Join(control, script)); err != nil || !strings.Contains(string(c), says) {
			t.Errorf("%s %s does not say %q: %v\n%s", deb, script, says, err, c)
		}
	}
	fields := run(t, ".", "dpkg-deb", "--field", debPath, "Package", "Architecture")
	t.Logf("%s:\n%s", deb, fields)
	if !strings.Contains(fields, "Package: walcount\n") || !strings.Contains(fields, "Architecture: amd64\n") {
		t.Errorf("%s fields:\n%s", deb, fields)
	}
	debRoot := filepath.Join(tmp, "deb")
	run(t, ".", "dpkg-deb", "--extract", debPath, debRoot)
	if got, _ := os.ReadFile(filepath.Join(debRoot, "usr/lib/systemd/system/walcount.service")); !bytes.Equal(got, unit) {
		t.Errorf("%s: the packaged unit differs from deploy/systemd/walcount.service", deb)
	}
	wantVersion(deb, filepath.Join(debRoot, "usr/bin/walcount"))

	// The .rpm, from its header.
	rf := rpmFiles(t, filepath.Join(dist, rpm))
	for _, p := range packageFiles {
		if _, ok := rf[p]; !ok {
			t.Errorf("%s has no %s (it has %v)", rpm, p, rf)
		}
	}
	for p, want := range map[string]rpmFile{
		"/usr/bin/walcount":          {mode: 0o100755, user: "root", group: "root"},
		"/etc/walcount/walcount.env": {mode: 0o100640, user: "root", group: "walcount", flags: rpmConfig | rpmNoReplace},
	} {
		if got := rf[p]; got.mode != want.mode || got.user != want.user || got.group != want.group || got.flags&want.flags != want.flags {
			t.Errorf("%s: %s is %+v, want %+v", rpm, p, got, want)
		}
	}
}

// untar extracts a .tar.gz into dir and returns the regular files' names.
func untar(t *testing.T, path, dir string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		names = append(names, h.Name)
		dst := filepath.Join(dir, filepath.FromSlash(h.Name))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		w, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o777)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(w, tr); err != nil {
			t.Fatal(err)
		}
		w.Close()
	}
	return names
}

// RPM header tags and file flags (rpm's lib/rpmtag.h, lib/rpmfiles.h).
const (
	tagFileModes     = 1030
	tagFileFlags     = 1037
	tagFileUserName  = 1039
	tagFileGroupName = 1040
	tagDirIndexes    = 1116
	tagBaseNames     = 1117
	tagDirNames      = 1118

	rpmConfig    = 1 << 0
	rpmNoReplace = 1 << 4
)

type rpmFile struct {
	mode        uint16
	flags       uint32
	user, group string
}

// rpmFiles reads the file list of an .rpm from its main header: lead (96
// bytes), signature header (padded to 8 bytes), main header.
func rpmFiles(t *testing.T, path string) map[string]rpmFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 96 || !bytes.Equal(b[:4], []byte{0xed, 0xab, 0xee, 0xdb}) {
		t.Fatalf("%s is not an rpm (no lead)", path)
	}
	// header parses the header at off and returns its tags' raw values
	// and the offset just past it.
	type entry struct {
		typ, count uint32
		data       []byte
	}
	header := func(off int) (map[uint32]entry, int) {
		if off+16 > len(b) || !bytes.Equal(b[off:off+3], []byte{0x8e, 0xad, 0xe8}) {
			t.Fatalf("%s: no header at %d", path, off)
		}
		n := int(binary.BigEndian.Uint32(b[off+8:]))
		size := int(binary.BigEndian.Uint32(b[off+12:]))
		store := off + 16 + 16*n
		if store+size > len(b) {
			t.Fatalf("%s: header at %d is truncated", path, off)
		}
		out := map[uint32]entry{}
		for i := range n {
			e := b[off+16+16*i:]
			tag, typ := binary.BigEndian.Uint32(e), binary.BigEndian.Uint32(e[4:])
			at, count := int(binary.BigEndian.Uint32(e[8:])), binary.BigEndian.Uint32(e[12:])
			out[tag] = entry{typ: typ, count: count, data: b[store+at : store+size]}
		}
		return out, store + size
	}
	_, end := header(96)
	end = (end + 7) &^ 7
	h, _ := header(end)
	strs := func(tag uint32) []string {
		e := h[tag]
		parts := strings.Split(string(e.data), "\x00")
		if uint32(len(parts)) < e.count {
			t.Fatalf("%s: tag %d has %d strings, want %d", path, tag, len(parts), e.count)
		}
		return parts[:e.count]
	}
	ints := func(tag uint32, size int) []uint32 {
		e := h[tag]
		out := make([]uint32, e.count)
		for i := range out {
			switch size {
			case 2:
				out[i] = uint32(binary.BigEndian.Uint16(e.data[2*i:]))
			case 4:
				out[i] = binary.BigEndian.Uint32(e.data[4*i:])
			}
		}
		return out
	}
	base, dirs, idx := strs(tagBaseNames), strs(tagDirNames), ints(tagDirIndexes, 4)
	modes, flags := ints(tagFileModes, 2), ints(tagFileFlags, 4)
	users, groups := strs(tagFileUserName), strs(tagFileGroupName)
	if len(base) == 0 || len(idx) != len(base) || len(modes) != len(base) || len(users) != len(base) {
		t.Fatalf("%s: inconsistent file tags (%d names, %d dir indexes, %d modes, %d users)", path, len(base), len(idx), len(modes), len(users))
	}
	out := map[string]rpmFile{}
	for i, name := range base {
		out[dirs[idx[i]]+name] = rpmFile{mode: uint16(modes[i]), flags: flags[i], user: users[i], group: groups[i]}
	}
	if len(out) == 0 {
		t.Fatalf("%s lists no files", path)
	}
	return out
}
