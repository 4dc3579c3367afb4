package deploy_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/walcount/walcount/app/config"
)

const chart = "helm/walcount"

// helmCmd runs the pinned helm (scripts/go-tool.sh) with its state in
// temporary directories, and returns its stdout, or fails with its output.
func helmCmd(t *testing.T, args ...string) string {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(goTool(t, "helm"), args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// manifest is a rendered Kubernetes object, decoded loosely.
type manifest map[string]any

// get walks m along path (map keys, or list indexes as ints).
func (m manifest) get(path ...any) any {
	var cur any = map[string]any(m)
	for _, p := range path {
		switch k := p.(type) {
		case string:
			mm, ok := cur.(map[string]any)
			if !ok {
				return nil
			}
			cur = mm[k]
		case int:
			l, ok := cur.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			cur = l[k]
		}
	}
	return cur
}

// render runs helm template with the --set values given (or a values file,
// "-f=path") and returns the objects by "Kind/name".
func render(t *testing.T, sets ...string) map[string]manifest {
	t.Helper()
	args := []string{"template", "rel", chart}
	for _, s := range sets {
		if f, ok := strings.CutPrefix(s, "-f="); ok {
			args = append(args, "-f", f)
			continue
		}
		args = append(args, "--set", s)
	}
	out := helmCmd(t, args...)
	objs := map[string]manifest{}
	dec := yaml.NewDecoder(strings.NewReader(out))
	for {
		// Into a plain map: nested mappings then decode as plain maps too.
		var raw map[string]any
		err := dec.Decode(&raw)
		m := manifest(raw)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("helm template %v: output is not YAML: %v\n%s", sets, err, out)
		}
		if m == nil {
			continue
		}
		key := m.get("kind").(string) + "/" + m.get("metadata", "name").(string)
		if _, dup := objs[key]; dup {
			t.Errorf("helm template %v renders %s twice", sets, key)
		}
		objs[key] = m
	}
	return objs
}

func kinds(objs map[string]manifest) []string {
	var ks []string
	for k := range objs {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// envOf returns a container's variables: name -> "secret/key" for a
// secretKeyRef, else the value.
func envOf(t *testing.T, c any) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, e := range c.(map[string]any)["env"].([]any) {
		m := manifest(e.(map[string]any))
		name := m.get("name").(string)
		if ref := m.get("valueFrom", "secretKeyRef"); ref != nil {
			r := manifest(ref.(map[string]any))
			out[name] = "secret " + r.get("name").(string) + "/" + r.get("key").(string)
		} else {
			out[name], _ = m.get("value").(string)
		}
	}
	return out
}

// TestHelmLint runs helm lint --strict on the chart with its defaults and
// with every option on.
func TestHelmLint(t *testing.T) {
	t.Parallel()
	helmCmd(t, "lint", "--strict", chart)
	helmCmd(t, "lint", "--strict", chart, "--set", "replicaCount=2,serviceMonitor.enabled=true,prometheusRule.enabled=true,httpToken.secretName=tok,config.slot=s,setup.databaseURL.secretName=admin")
}

// TestHelmTemplate renders the chart and checks the objects: by default one
// Deployment replica with probes on /healthz and /readyz, URLs from the
// release's Secret (WALCOUNT_ variables the loader reads), a sandboxed
// container, a Service and the setup Job as a pre-install/pre-upgrade hook,
// and no Prometheus Operator objects; with options, a warm standby second
// replica, the config file, the token, a ServiceMonitor whose job label is
// "walcount" (as the alerts expect) and a PrometheusRule that holds exactly
// deploy/prometheus/alerts.yml's groups.
func TestHelmTemplate(t *testing.T) {
	t.Parallel()
	objs := render(t)
	want := []string{"Deployment/rel-walcount", "Job/rel-walcount-setup", "Service/rel-walcount"}
	if got := kinds(objs); !slices.Equal(got, want) {
		t.Errorf("helm template with defaults renders %q, want %q", got, want)
	}
	dep := objs["Deployment/rel-walcount"]
	if r := dep.get("spec", "replicas"); r != 1 {
		t.Errorf("default replicas = %v, want 1", r)
	}
	if s := dep.get("spec", "strategy", "type"); s != "Recreate" {
		t.Errorf("strategy %v, want Recreate (a standby never becomes ready, so a rolling update would stall)", s)
	}
	c := dep.get("spec", "template", "spec", "containers", 0)
	cm := manifest(c.(map[string]any))
	if p := cm.get("livenessProbe", "httpGet", "path"); p != "/healthz" {
		t.Errorf("liveness probe path %v, want /healthz", p)
	}
	if p := cm.get("readinessProbe", "httpGet", "path"); p != "/readyz" {
		t.Errorf("readiness probe path %v, want /readyz", p)
	}
	if p := cm.get("ports", 0, "containerPort"); p != 9750 {
		t.Errorf("container port %v, want 9750", p)
	}
	if v := cm.get("securityContext", "readOnlyRootFilesystem"); v != true {
		t.Errorf("readOnlyRootFilesystem %v, want true", v)
	}
	if v := dep.get("spec", "template", "spec", "securityContext", "runAsNonRoot"); v != true {
		t.Errorf("runAsNonRoot %v, want true", v)
	}
	env := envOf(t, c)
	for name, v := range map[string]string{
		config.EnvDatabaseURL: "secret rel-walcount/database-url",
		config.EnvRedisURL:    "secret rel-walcount/redis-url",
		config.EnvHTTPAddr:    "0.0.0.0:9750",
	} {
		if env[name] != v {
			t.Errorf("daemon %s = %q, want %q", name, env[name], v)
		}
	}
	for _, name := range []string{config.EnvHTTPToken, config.EnvConfig} {
		if _, ok := env[name]; ok {
			t.Errorf("daemon has %s by default", name)
		}
	}
	for name := range env {
		known := false
		for _, s := range config.Settings {
			known = known || s.Env == name
		}
		if !known {
			t.Errorf("daemon variable %s is not one walcount reads", name)
		}
	}
	job := objs["Job/rel-walcount-setup"]
	if h := job.get("metadata", "annotations", "helm.sh/hook"); h != "pre-install,pre-upgrade" {
		t.Errorf("setup Job hook %v, want pre-install,pre-upgrade", h)
	}
	if a := job.get("spec", "template", "spec", "containers", 0, "args"); !reflect.DeepEqual(a, []any{"setup"}) {
		t.Errorf("setup Job args %v, want [setup]", a)
	}
	if l := job.get("spec", "template", "metadata", "labels", "app.kubernetes.io/name"); l == "walcount" {
		t.Error("the setup Job's pod has the daemon's labels: the Service would select it")
	}
	svc := objs["Service/rel-walcount"]
	if !reflect.DeepEqual(svc.get("spec", "selector"), dep.get("spec", "selector", "matchLabels")) {
		t.Errorf("Service selector %v is not the Deployment's %v", svc.get("spec", "selector"), dep.get("spec", "selector", "matchLabels"))
	}

	objs = render(t, "replicaCount=2", "serviceMonitor.enabled=true", "prometheusRule.enabled=true",
		"httpToken.secretName=tok", "config.slot=myslot", "setup.databaseURL.secretName=admin")
	want = []string{"ConfigMap/rel-walcount", "ConfigMap/rel-walcount-setup", "Deployment/rel-walcount", "Job/rel-walcount-setup",
		"PrometheusRule/rel-walcount", "Service/rel-walcount", "ServiceMonitor/rel-walcount"}
	if got := kinds(objs); !slices.Equal(got, want) {
		t.Errorf("helm template with every option renders %q, want %q", got, want)
	}
	dep = objs["Deployment/rel-walcount"]
	if r := dep.get("spec", "replicas"); r != 2 {
		t.Errorf("replicaCount=2: replicas = %v, want 2 (a warm standby)", r)
	}
	env = envOf(t, dep.get("spec", "template", "spec", "containers", 0))
	if env[config.EnvHTTPToken] != "secret tok/http-token" || env[config.EnvConfig] != "/etc/walcount/walcount.yaml" {
		t.Errorf("daemon token %q, config %q", env[config.EnvHTTPToken], env[config.EnvConfig])
	}
	if d := objs["ConfigMap/rel-walcount"].get("data", "walcount.yaml"); d != "slot: myslot\n" {
		t.Errorf("config file %q, want slot: myslot", d)
	}
	jobEnv := envOf(t, objs["Job/rel-walcount-setup"].get("spec", "template", "spec", "containers", 0))
	if jobEnv[config.EnvDatabaseURL] != "secret admin/database-url" {
		t.Errorf("setup's %s = %q, want the setup's own secret", config.EnvDatabaseURL, jobEnv[config.EnvDatabaseURL])
	}

	sm := objs["ServiceMonitor/rel-walcount"]
	label, _ := sm.get("spec", "jobLabel").(string)
	if v := objs["Service/rel-walcount"].get("metadata", "labels", label); v != "walcount" {
		t.Errorf("ServiceMonitor jobLabel %q gives job=%v, want walcount (the alerts select job=\"walcount\")", label, v)
	}
	if p, path := sm.get("spec", "endpoints", 0, "port"), sm.get("spec", "endpoints", 0, "path"); p != "http" || path != "/metrics" {
		t.Errorf("ServiceMonitor endpoint %v %v, want port http path /metrics", p, path)
	}

	// The PrometheusRule holds the alerts file's groups, unchanged.
	b, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules map[string]any
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	got := objs["PrometheusRule/rel-walcount"].get("spec")
	if !reflect.DeepEqual(got, rules) {
		t.Errorf("the PrometheusRule's spec is not deploy/prometheus/alerts.yml:\ngot  %v\nwant %v", got, rules)
	}
}

// TestHelmConfigFile renders the chart with counters in its config value
// and loads the rendered file (daemon's and setup's) with walcount's own
// parser: what the chart mounts is a config walcount accepts.
func TestHelmConfigFile(t *testing.T) {
	t.Parallel()
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(`config:
  slot: chart_slot
  flush_interval: 2s
  counters:
    - name: post_likes
      source: public.likes
      key: post_id
      target: public.posts
      target_key: id
      column: likes_count
`), 0o644); err != nil {
		t.Fatal(err)
	}
	objs := render(t, "-f="+values)
	for _, name := range []string{"ConfigMap/rel-walcount", "ConfigMap/rel-walcount-setup"} {
		data, _ := objs[name].get("data", "walcount.yaml").(string)
		cfg, err := config.Parse([]byte(data), name)
		if err != nil {
			t.Errorf("%s: walcount does not accept the rendered config: %v\n%s", name, err, data)
			continue
		}
		if cfg.Slot != "chart_slot" || cfg.FlushInterval != 2*time.Second || len(cfg.Counters) != 1 || cfg.Counters[0].Name != "post_likes" {
			t.Errorf("%s: parsed slot %q, flush interval %v, counters %+v", name, cfg.Slot, cfg.FlushInterval, cfg.Counters)
		}
	}
}

// TestHelmAlertsCopy keeps the chart's copy of the alerts (a chart can only
// read files inside itself) equal to deploy/prometheus/alerts.yml.
func TestHelmAlertsCopy(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	cp, err := os.ReadFile(chart + "/files/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(src, cp) {
		t.Errorf("deploy/helm/walcount/files/alerts.yml differs from deploy/prometheus/alerts.yml: " +
			"cp deploy/prometheus/alerts.yml deploy/helm/walcount/files/alerts.yml")
	}
}
