package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/walcount/walcount/app/config"
)

// dockerfile is the Dockerfile's instructions, continuation lines joined,
// comments dropped, each as [INSTRUCTION, arguments].
func dockerfile(t *testing.T) [][2]string {
	t.Helper()
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var out [][2]string
	var cur string
	for line := range strings.SplitSeq(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur == "" && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if s, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur += s + " "
			continue
		}
		cur += trimmed
		instr, args, _ := strings.Cut(cur, " ")
		out = append(out, [2]string{strings.ToUpper(instr), strings.TrimSpace(args)})
		cur = ""
	}
	return out
}

var (
	argRef = regexp.MustCompile(`\$\{(\w+)\}`)
	pinned = regexp.MustCompile(`^[^\s@]+:[^\s@]+@sha256:[0-9a-f]{64}$`)
	ldflag = regexp.MustCompile(`-ldflags="([^"]*)"`)
)

// TestDockerfile checks what can be checked without a Docker engine (this
// machine has none): every base image is pinned by digest, the API listens
// beyond loopback on the port the image exposes, the HEALTHCHECK runs
// walcount healthcheck, and the build's -ldflags, with the build arguments
// filled in, stamp a version that `walcount --version` prints.
func TestDockerfile(t *testing.T) {
	t.Parallel()
	args := map[string]string{}
	var froms []string
	stages := map[string]bool{}
	var env, expose, health, build string
	for _, in := range dockerfile(t) {
		switch in[0] {
		case "ARG":
			k, v, _ := strings.Cut(in[1], "=")
			if _, seen := args[k]; !seen || v != "" {
				args[k] = v
			}
		case "FROM":
			f := strings.Fields(in[1])
			froms = append(froms, argRef.ReplaceAllStringFunc(f[0], func(m string) string { return args[m[2:len(m)-1]] }))
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				stages[f[2]] = true
			}
		case "ENV":
			env += in[1] + "\n"
		case "EXPOSE":
			expose = in[1]
		case "HEALTHCHECK":
			health = in[1]
		case "RUN":
			if strings.Contains(in[1], "go build") {
				build = in[1]
			}
		}
	}
	if len(froms) != 2 {
		t.Errorf("FROM images %q: want a build stage and a runtime stage", froms)
	}
	for _, f := range froms {
		if !stages[f] && !pinned.MatchString(f) {
			t.Errorf("base image %q is not pinned by digest (name:tag@sha256:<64 hex>)", f)
		}
	}

	s, _ := config.SettingByFlag("http-addr")
	m := regexp.MustCompile(`(?m)^` + s.Env + `=0\.0\.0\.0:(\d+)$`).FindStringSubmatch(env)
	if m == nil {
		t.Errorf("the image does not set %s=0.0.0.0:<port>, so a published port serves nothing; ENV is %q", s.Env, env)
	} else if expose != m[1] {
		t.Errorf("the image listens on port %s but EXPOSEs %q", m[1], expose)
	}
	if !strings.HasSuffix(health, `CMD ["/walcount", "healthcheck"]`) {
		t.Errorf("HEALTHCHECK %q does not run /walcount healthcheck", health)
	}

	lm := ldflag.FindStringSubmatch(build)
	if lm == nil {
		t.Fatalf("the go build step %q has no -ldflags=\"...\"", build)
	}
	const rev = "0123456789abcdef0123456789abcdef01234567"
	for _, tc := range []struct {
		args map[string]string
		want string
	}{
		{map[string]string{"VERSION": "v9.8.7-dockerfile-test", "REVISION": rev, "MODIFIED": "false"},
			"walcount v9.8.7-dockerfile-test (revision 0123456789ab, "},
		{map[string]string{"VERSION": "v9.8.7-dockerfile-test", "REVISION": rev, "MODIFIED": "true"},
			"walcount v9.8.7-dockerfile-test (revision 0123456789ab, modified, "},
		// No build arguments and no .git in the context.
		{map[string]string{}, "walcount dev (revision unknown, modified unknown, "},
	} {
		flags := argRef.ReplaceAllStringFunc(lm[1], func(m string) string { return tc.args[m[2:len(m)-1]] })
		bin := filepath.Join(t.TempDir(), "walcount")
		cmd := exec.Command("go", "build", "-buildvcs=false", "-trimpath", "-ldflags="+flags, "-o", bin, "./cmd/walcount")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build -ldflags=%q: %v\n%s", flags, err, out)
		}
		out, err := exec.Command(bin, "--version").CombinedOutput()
		if err != nil {
			t.Fatalf("walcount --version: %v\n%s", err, out)
		}
		want := tc.want + runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"
		if string(out) != want {
			t.Errorf("built with -ldflags=%q, walcount --version says %q, want %q", flags, out, want)
		}
	}
}
