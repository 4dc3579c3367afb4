package config

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// docTable is the table of docs/configuration.md's "Where a setting comes
// from", as Table declares it: one row per setting a flag sets.
func docTable() string {
	var b strings.Builder
	b.WriteString("| setting | flag | environment | config key | default | meaning |\n|---|---|---|---|---|---|\n")
	for _, s := range Settings {
		env := "`" + s.Env + "`"
		if s.Fallback != "" {
			env += ", then `" + s.Fallback + "`"
		}
		key := ""
		if s.Key != "" {
			key = " `" + s.Key + "`"
		}
		def := "`" + s.Default + "`"
		if s.Default == "none" {
			def = "none"
		}
		b.WriteString("| " + s.Name + " | `--" + s.Flag + "` | " + env + " |" + key + " | " + def + " | " + s.Doc + " |\n")
	}
	return b.String()
}

// TestConfigurationDocTable fails when docs/configuration.md's table of
// flags and Table disagree: the doc's table must be docTable's output, line
// for line. WALCOUNT_UPDATE_DOCS=1 writes it into the doc. The doc's table
// of file keys (### Settings) must name every key of Table, and no other.
func TestConfigurationDocTable(t *testing.T) {
	const path = "../../docs/configuration.md"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	const head = "| setting | flag | environment | config key | default | meaning |\n"
	start := strings.Index(doc, head)
	if start < 0 {
		t.Fatalf("%s has no table that starts %q", path, head)
	}
	end := start + strings.Index(doc[start:], "\n\n") + 1
	want := docTable()
	if got := doc[start:end]; got != want {
		if os.Getenv("WALCOUNT_UPDATE_DOCS") == "1" {
			if err := os.WriteFile(path, []byte(doc[:start]+want+doc[end:]), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("wrote the table into %s", path)
			return
		}
		t.Errorf("%s's table of flags differs from config.Table (WALCOUNT_UPDATE_DOCS=1 go test -run TestConfigurationDocTable ./app/config writes it); want:\n%s\ngot:\n%s", path, want, got)
	}

	settings := strings.Index(doc, "### Settings\n")
	if settings < 0 {
		t.Fatalf("%s has no ### Settings section", path)
	}
	rest := doc[settings:]
	rest = rest[:strings.Index(rest, "\n\n### ")]
	var documented []string
	cell := regexp.MustCompile("`([a-z_.]+)`")
	for line := range strings.SplitSeq(rest, "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "| `") || len(cells) < 3 {
			continue
		}
		for _, m := range cell.FindAllStringSubmatch(cells[1], -1) {
			documented = append(documented, m[1])
		}
	}
	for _, s := range Table {
		if s.Key != "" && !slices.Contains(documented, s.Key) {
			t.Errorf("%s's ### Settings table has no row for %s", path, s.Key)
		}
	}
	for _, k := range documented {
		if !slices.ContainsFunc(Table, func(s Setting) bool { return s.Key == k }) {
			t.Errorf("%s's ### Settings table documents %s, which config.Table does not declare", path, k)
		}
	}
}

// TestTableCoversConfig: every leaf of Config's yaml layout (but the
// counters) is a setting of Table, so that the file cannot hold a key
// that walcount config does not show.
func TestTableCoversConfig(t *testing.T) {
	var c Config
	for _, key := range yamlLeaves(c) {
		if !slices.ContainsFunc(Table, func(s Setting) bool { return s.Key == key }) {
			t.Errorf("Config's file key %s has no entry in config.Table", key)
		}
	}
}

// yamlLeaves lists the dotted yaml paths of v's fields that are not blocks.
func yamlLeaves(v any) []string {
	var out []string
	var walk func(prefix string, t reflect.Type)
	walk = func(prefix string, t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if tag == "" || tag == "-" {
				continue
			}
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Duration(0)) {
				walk(prefix+tag+".", f.Type)
				continue
			}
			out = append(out, prefix+tag)
		}
	}
	walk("", reflect.TypeOf(v))
	return out
}
