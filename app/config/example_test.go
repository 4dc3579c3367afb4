package config

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/walcount/walcount/reconcile"
)

// examplePath is the sample configuration file the repository ships.
const examplePath = "../../deploy/walcount.example.yaml"

// TestExampleConfig loads deploy/walcount.example.yaml: it is valid, it
// sets every key a file may hold (those of fileConfig, at every level), and
// each at its default, so the sample cannot rot as settings are added or
// defaults change.
func TestExampleConfig(t *testing.T) {
	data, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(examplePath, func(string) (string, bool) { return "", false }, Overrides{})
	if err != nil {
		t.Fatalf("load %s: %v", examplePath, err)
	}

	// Every key of the file's layout appears.
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		switch n.Kind {
		case yaml.DocumentNode:
			walk(n.Content[0], prefix)
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := prefix + n.Content[i].Value
				have[k] = true
				if !strings.HasSuffix(k, ".where") {
					walk(n.Content[i+1], k+".")
				}
			}
		case yaml.SequenceNode:
			for _, c := range n.Content {
				walk(c, prefix)
			}
		}
	}
	walk(&doc, "")
	for _, k := range fileKeys(reflect.TypeOf(fileConfig{}), "") {
		if !have[k] {
			t.Errorf("%s does not show key %s", examplePath, k)
		}
	}

	// Each at its default.
	want := Default()
	if cfg.Reconcile.Interval == nil || *cfg.Reconcile.Interval != reconcile.DefaultInterval {
		t.Errorf("reconcile.interval = %v, want the default %s", cfg.Reconcile.Interval, reconcile.DefaultInterval)
	}
	cfg.Reconcile.Interval = nil
	for i := range cfg.Counters {
		if len(cfg.Counters[i].Where) == 0 {
			cfg.Counters[i].Where = nil
		}
	}
	cfg.File, cfg.Origin = "", nil
	if err := want.Validate(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("%s does not hold the defaults:\n got %+v\nwant %+v", examplePath, cfg, want)
	}
}

// fileKeys returns the dotted keys of the YAML layout t (a struct), in
// order; a counter's keys appear as counters.<key>.
func fileKeys(t reflect.Type, prefix string) []string {
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		k := prefix + name
		keys = append(keys, k)
		ft := f.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct && ft.PkgPath() == t.PkgPath() && !slices.Contains([]string{"Duration"}, ft.Name()) {
			keys = append(keys, fileKeys(ft, k+".")...)
		}
	}
	return keys
}
