package config

import (
	"maps"
	"strings"
	"testing"
)

// TestLoadCreateMissing reads create_missing's forms: true, false, and a
// mapping of defaults (column names read as SQL identifiers), and refuses
// anything else with the field and line.
func TestLoadCreateMissing(t *testing.T) {
	base := "counters:\n  - {name: c, source: likes, key: post_id, target: posts, target_key: id, column: n, "
	tests := []struct {
		name, yaml string
		create     bool
		defaults   map[string]string
		err        string
	}{
		{name: "absent", yaml: base + "}\n"},
		{name: "true", yaml: base + "create_missing: true}\n", create: true},
		{name: "false", yaml: base + "create_missing: false}\n"},
		{name: "defaults", yaml: base + `create_missing: {defaults: {Score: 0, '"Title"': "", flag: true}}}` + "\n", create: true,
			defaults: map[string]string{"score": "0", "Title": "", "flag": "true"}},
		{name: "empty mapping", yaml: base + "create_missing: {}}\n", create: true},
		{name: "a string", yaml: base + "create_missing: yes please}\n", err: "counters[0] (c).create_missing: must be true, false or {defaults:"},
		{name: "unknown key", yaml: base + "create_missing: {default: {a: 1}}}\n", err: "counters[0] (c).create_missing.default: unknown key"},
		{name: "null default", yaml: base + "create_missing: {defaults: {a: null}}}\n", err: "create_missing.defaults.a: null is what a column without a default gets anyway"},
		{name: "list default", yaml: base + "create_missing: {defaults: {a: [1]}}}\n", err: "create_missing.defaults.a: must be a value"},
		{name: "default for the counter column", yaml: base + "create_missing: {defaults: {n: 1}}}\n", err: `create_missing.defaults.n: "n" is the counter column`},
		{name: "default for the target key", yaml: base + "create_missing: {defaults: {id: 1}}}\n", err: `create_missing.defaults.id: "id" is the target_key`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Load(writeFile(t, tt.yaml), mapEnv(nil), nil)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Load error = %v, want it to contain %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c := cfg.Counters[0]
			if c.CreateMissing != tt.create || !maps.Equal(c.Defaults, tt.defaults) {
				t.Errorf("create_missing %v defaults %v, want %v %v", c.CreateMissing, c.Defaults, tt.create, tt.defaults)
			}
		})
	}
}
