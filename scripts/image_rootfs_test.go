package scripts_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestImageRootfs runs image-rootfs.sh, which assembles the root file
// system of the image's BASE=local runtime (make image BASE=local), with a
// CA bundle of its own: the nonroot user and group 65532 as distroless
// has them, the bundle where Go looks for it, /tmp of mode 1777, an empty
// home for the Dockerfile to chown; a second run replaces the first's; a
// missing bundle is an error that says what to install. TestImage (in
// ./deploy, with a Docker engine) checks the image made from it.
func TestImageRootfs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bundle := filepath.Join(dir, "bundle.pem")
	const pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
	if err := os.WriteFile(bundle, []byte(pem), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "image")
	run := func(bundle string) (string, error) {
		cmd := exec.Command("/bin/sh", "image-rootfs.sh", out)
		cmd.Env = append(os.Environ(), "WALCOUNT_CA_BUNDLE="+bundle)
		b, err := cmd.CombinedOutput()
		return string(b), err
	}
	if msg, err := run(bundle); err != nil {
		t.Fatalf("image-rootfs.sh: %v\n%s", err, msg)
	}
	// A stale file of an earlier run goes.
	stale := filepath.Join(out, "rootfs", "stale")
	if err := os.WriteFile(stale, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if msg, err := run(bundle); err != nil {
		t.Fatalf("image-rootfs.sh, again: %v\n%s", err, msg)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("a second run kept %s of the first (%v)", stale, err)
	}

	root := filepath.Join(out, "rootfs")
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if p := read("etc/passwd"); !strings.Contains(p, "\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n") || !strings.HasPrefix(p, "root:x:0:0:") {
		t.Errorf("etc/passwd:\n%s", p)
	}
	if g := read("etc/group"); !strings.Contains(g, "\nnonroot:x:65532:\n") {
		t.Errorf("etc/group:\n%s", g)
	}
	if c := read("etc/ssl/certs/ca-certificates.crt"); c != pem {
		t.Errorf("etc/ssl/certs/ca-certificates.crt is %q, want the bundle's %q", c, pem)
	}
	for name, want := range map[string]os.FileMode{
		"rootfs/tmp":        os.ModeDir | os.ModeSticky | 0o777,
		"rootfs/home":       os.ModeDir | 0o755,
		"rootfs/etc/passwd": 0o644,
		"rootfs/etc/ssl/certs/ca-certificates.crt": 0o644,
		"nonroot-home": os.ModeDir | 0o755,
	} {
		fi, err := os.Stat(filepath.Join(out, name))
		if err != nil {
			t.Error(err)
		} else if fi.Mode() != want {
			t.Errorf("%s has mode %v, want %v", name, fi.Mode(), want)
		}
	}
	if ents, err := os.ReadDir(filepath.Join(root, "home")); err != nil || len(ents) != 0 {
		t.Errorf("rootfs/home holds %v (%v), want nothing: /home/nonroot is nonroot-home, chowned by the Dockerfile", ents, err)
	}

	msg, err := run(filepath.Join(dir, "missing.pem"))
	if err == nil || !strings.Contains(msg, "no CA bundle at") || !strings.Contains(msg, "ca-certificates") {
		t.Errorf("image-rootfs.sh with no bundle: %v, %q; want an error naming ca-certificates", err, msg)
	}
}
