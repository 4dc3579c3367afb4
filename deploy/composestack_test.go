package deploy_test

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// composeStack is the part of docker-compose.yml the monitoring tests read.
type composeStack struct {
	Services map[string]struct {
		Image    string      `yaml:"image"`
		Command  commandLine `yaml:"command"`
		Volumes  []string    `yaml:"volumes"`
		Profiles []string    `yaml:"profiles"`
	} `yaml:"services"`
}

// commandLine is a service's command, a list or a string split at
// spaces.
type commandLine []string

func (c *commandLine) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*c = strings.Fields(n.Value)
		return nil
	}
	var list []string
	err := n.Decode(&list)
	*c = list
	return err
}

// promConfig is the part of a Prometheus configuration the tests read.
type promConfig struct {
	RuleFiles     []string `yaml:"rule_files"`
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		MetricsPath   string `yaml:"metrics_path"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

// mounts returns the bind mounts of a service: container path → file or
// directory of the repository, which must exist.
func mounts(t *testing.T, volumes []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, v := range volumes {
		src, rest, ok := strings.Cut(v, ":")
		if !ok || !strings.HasPrefix(src, "./") {
			continue // a named volume
		}
		dst, _, _ := strings.Cut(rest, ":")
		local := filepath.Join("..", src)
		if _, err := os.Stat(local); err != nil {
			t.Errorf("volume %q mounts %s, which does not exist: %v", v, src, err)
		}
		out[dst] = local
	}
	return out
}

// TestComposeMonitoring checks the compose file's Prometheus and Grafana as
// far as this machine allows (their images cannot be pulled): Prometheus's
// configuration, laid out as the container sees its mounts, passes
// `promtool check config` with the alert rules loaded; it scrapes the
// walcount service at the port its --http-addr names, as job "walcount",
// the job every alert selects; Grafana is optional (a profile) and gets the
// data source and the dashboard.
func TestComposeMonitoring(t *testing.T) {
	b, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c composeStack
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	prom, ok := c.Services["prometheus"]
	if !ok {
		t.Fatal("docker-compose.yml has no prometheus service")
	}
	if len(prom.Profiles) != 0 {
		t.Errorf("prometheus is in profiles %v: it should start with the stack", prom.Profiles)
	}
	var configPath string
	for _, arg := range prom.Command {
		if p, ok := strings.CutPrefix(arg, "--config.file="); ok {
			configPath = p
		}
	}
	m := mounts(t, prom.Volumes)
	local, ok := m[configPath]
	if configPath == "" || !ok {
		t.Fatalf("prometheus's --config.file %q is not mounted from the repository (mounts %v)", configPath, m)
	}

	// The container's view of its mounts, in a temporary directory.
	root := t.TempDir()
	for dst, src := range m {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, dst)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(promtool(t), "check", "config", filepath.Join(root, configPath)).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
	t.Logf("promtool check config:\n%s", out)

	data, err := os.ReadFile(local)
	if err != nil {
		t.Fatal(err)
	}
	var pc promConfig
	if err := yaml.Unmarshal(data, &pc); err != nil {
		t.Fatal(err)
	}
	// The rules are the project's alerts.
	var rules []string
	for _, r := range pc.RuleFiles {
		rules = append(rules, m[path.Join(path.Dir(configPath), r)])
	}
	if !slices.Contains(rules, filepath.Join("..", "deploy", "prometheus", "alerts.yml")) {
		t.Errorf("prometheus loads rules %v (from %v), not deploy/prometheus/alerts.yml", rules, pc.RuleFiles)
	}

	// The scrape job: walcount's service and API port, job "walcount".
	w, ok := c.Services["walcount"]
	if !ok {
		t.Fatal("no walcount service")
	}
	port := ""
	for i, arg := range w.Command {
		if arg == "--http-addr" && i+1 < len(w.Command) {
			_, port, _ = strings.Cut(w.Command[i+1], ":")
		}
	}
	want := "walcount:" + port
	var job string
	for _, sc := range pc.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			if slices.Contains(st.Targets, want) {
				job = sc.JobName
				if sc.MetricsPath != "" && sc.MetricsPath != "/metrics" {
					t.Errorf("job %s scrapes %s, not /metrics", job, sc.MetricsPath)
				}
			}
		}
	}
	if port == "" || job == "" {
		t.Fatalf("no scrape job targets %s (the walcount service's --http-addr)", want)
	}
	alerts, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	jobs := regexp.MustCompile(`job="([^"]*)"`).FindAllStringSubmatch(string(alerts), -1)
	if len(jobs) == 0 {
		t.Error("no alert selects a job: the test checks nothing")
	}
	for _, j := range jobs {
		if j[1] != job {
			t.Errorf("an alert selects job=%q, but compose scrapes walcount as job %q", j[1], job)
		}
	}

	// Grafana: optional, with the data source and the dashboard.
	g, ok := c.Services["grafana"]
	if !ok {
		t.Fatal("no grafana service")
	}
	if !slices.Contains(g.Profiles, "grafana") {
		t.Errorf("grafana is in profiles %v, want an optional profile \"grafana\"", g.Profiles)
	}
	gm := mounts(t, g.Volumes)
	if gm["/var/lib/grafana/dashboards/walcount.json"] != filepath.Join("..", "deploy", "grafana", "walcount.json") {
		t.Errorf("grafana does not get deploy/grafana/walcount.json where its provider looks: %v", gm)
	}
	for _, dir := range []string{"/etc/grafana/provisioning/datasources", "/etc/grafana/provisioning/dashboards"} {
		if _, ok := gm[dir]; !ok {
			t.Errorf("grafana has nothing mounted at %s", dir)
		}
	}
	ds, err := os.ReadFile(filepath.Join(gm["/etc/grafana/provisioning/datasources"], "prometheus.yml"))
	if err != nil || !strings.Contains(string(ds), "http://prometheus:9090") {
		t.Errorf("grafana's data source does not point at the prometheus service: %v\n%s", err, ds)
	}
	for _, s := range []string{prom.Image, g.Image} {
		if !strings.Contains(s, ":") || strings.HasSuffix(s, ":latest") {
			t.Errorf("image %q is not pinned to a version", s)
		}
	}
}
