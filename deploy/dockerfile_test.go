package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
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

// stage is a stage of the Dockerfile: its FROM (ARGs not yet expanded),
// its name and the stages or images its COPY --from instructions read.
type stage struct {
	from, name string
	copyFrom   []string
}

// baseImages returns the images outside the Dockerfile that a build of
// its last stage pulls with the given build arguments, when BuildKit
// builds only the stages the target needs: the FROMs and COPY --froms
// reached from the last stage that are neither stages nor scratch. It
// fails the test on a FROM or COPY --from that names a later stage.
func baseImages(t *testing.T, stages []stage, defaults, args map[string]string) []string {
	t.Helper()
	expand := func(s string) string {
		return argRef.ReplaceAllStringFunc(s, func(m string) string {
			k := m[2 : len(m)-1]
			if v, ok := args[k]; ok {
				return v
			}
			return defaults[k]
		})
	}
	index := map[string]int{}
	for i, st := range stages {
		if st.name != "" {
			index[st.name] = i
		}
	}
	var images []string
	seen := map[int]bool{}
	var visit func(i int)
	visit = func(i int) {
		if seen[i] {
			return
		}
		seen[i] = true
		refs := append([]string{expand(stages[i].from)}, stages[i].copyFrom...)
		for _, ref := range refs {
			if j, ok := index[ref]; ok {
				if j >= i {
					t.Errorf("stage %d (%s) reads stage %s, which comes later", i, stages[i].name, ref)
					continue
				}
				visit(j)
			} else if ref != "scratch" && !slices.Contains(images, ref) {
				images = append(images, ref)
			}
		}
	}
	visit(len(stages) - 1)
	return images
}

// TestDockerfile checks what can be checked without a Docker engine
// (TestImage builds and runs the image where one runs): every base image
// is pinned by digest; the default BASE pulls the golang and distroless
// images and BASE=local pulls none; the API listens beyond loopback on
// the port the image exposes; the HEALTHCHECK runs walcount healthcheck;
// the build's -ldflags, with the build arguments filled in, stamp a
// version that `walcount --version` prints, and make image BASE=local
// builds on the host with the same flags.
func TestDockerfile(t *testing.T) {
	t.Parallel()
	args := map[string]string{}
	var stages []stage
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
			st := stage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			stages = append(stages, st)
		case "COPY":
			for _, f := range strings.Fields(in[1]) {
				if from, ok := strings.CutPrefix(f, "--from="); ok && len(stages) > 0 {
					stages[len(stages)-1].copyFrom = append(stages[len(stages)-1].copyFrom, from)
				}
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
	if len(stages) == 0 {
		t.Fatal("the Dockerfile has no FROM")
	}
	if args["BASE"] != "distroless" {
		t.Errorf("ARG BASE defaults to %q, want distroless", args["BASE"])
	}
	images := baseImages(t, stages, args, nil)
	slices.Sort(images)
	if want := []string{args["RUNTIME_IMAGE"], args["GO_IMAGE"]}; !slices.Equal(images, want) {
		t.Errorf("the default build pulls %q, want the golang builder and the distroless runtime %q", images, want)
	}
	for _, im := range images {
		if !pinned.MatchString(im) {
			t.Errorf("base image %q is not pinned by digest (name:tag@sha256:<64 hex>)", im)
		}
	}
	if !strings.Contains(args["GO_IMAGE"], "golang:") || !strings.Contains(args["RUNTIME_IMAGE"], "distroless/static") {
		t.Errorf("GO_IMAGE %q, RUNTIME_IMAGE %q: want golang and distroless static", args["GO_IMAGE"], args["RUNTIME_IMAGE"])
	}
	if local := baseImages(t, stages, args, map[string]string{"BASE": "local"}); len(local) != 0 {
		t.Errorf("BASE=local pulls %q, want nothing (a machine without a registry builds it)", local)
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
	checkMakefileImageBuild(t, build, lm[1])
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

// checkMakefileImageBuild checks that make image BASE=local builds the
// binary as the Dockerfile's build stage does: without cgo, for linux,
// -trimpath, and -ldflags that are the Dockerfile's with the Makefile's
// variables for the build arguments.
func checkMakefileImageBuild(t *testing.T, build, ldflags string) {
	t.Helper()
	b, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	mk := string(b)
	vars := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^(\w+) = (.*)$`).FindAllStringSubmatch(mk, -1) {
		vars[m[1]] = m[2]
	}
	got := strings.NewReplacer(
		"$(BUILDINFO)", vars["BUILDINFO"],
		"$(GIT_VERSION)", "${VERSION}",
		"$(GIT_REVISION)", "${REVISION}",
		"$(GIT_MODIFIED)", "${MODIFIED}",
	).Replace(vars["IMAGE_LDFLAGS"])
	if got != ldflags {
		t.Errorf("the Makefile's IMAGE_LDFLAGS are, with the Dockerfile's build arguments, %q; the Dockerfile's -ldflags are %q", got, ldflags)
	}
	local := regexp.MustCompile(`(?m)^.*\$\(GO\) build .*-ldflags "\$\(IMAGE_LDFLAGS\)".*$`).FindString(mk)
	for _, f := range []string{"CGO_ENABLED=0", "GOOS=linux", "-trimpath", "./cmd/walcount"} {
		if !strings.Contains(build, f) || !strings.Contains(local, f) {
			t.Errorf("the Dockerfile's build %q and make image BASE=local's %q do not both have %s", build, local, f)
		}
	}
	if !strings.Contains(local, "-o bin/image/walcount") {
		t.Errorf("make image BASE=local builds %q, not into bin/image/walcount, which the Dockerfile copies", local)
	}
}
