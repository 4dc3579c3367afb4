package config

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeSettingsTable holds the README's table of settings (### Settings)
// to Settings: every setting a flag sets has a row naming its flag, its
// variable and its default, and every flag a row names is one of them. A
// new operator reads the README first; a flag missing there (--on-slot-loss
// was) is a flag they never learn of.
func TestReadmeSettingsTable(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	start := strings.Index(doc, "| setting | flag | environment | default |\n")
	if start < 0 {
		t.Fatal("README.md has no table that starts | setting | flag | environment | default |")
	}
	table := doc[start : start+strings.Index(doc[start:], "\n\n")]
	flagRe := regexp.MustCompile("`--([a-z-]+)`")
	rows := map[string]string{} // flag → its row
	for line := range strings.SplitSeq(table, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 5 {
			continue
		}
		for _, m := range flagRe.FindAllStringSubmatch(cells[2], -1) {
			rows[m[1]] = line
		}
	}
	byFlag := map[string]Setting{}
	for _, s := range Settings {
		byFlag[s.Flag] = s
		row, ok := rows[s.Flag]
		if !ok {
			t.Errorf("README.md's settings table has no row for --%s", s.Flag)
			continue
		}
		if !strings.Contains(row, "`"+s.Env+"`") {
			t.Errorf("README.md's row for --%s does not name %s: %s", s.Flag, s.Env, row)
		}
		def := "`" + s.Default + "`"
		if s.Default == "none" || strings.Contains(s.Default, " ") {
			def = s.Default // words, not a value to type
		}
		if !strings.Contains(row, def) {
			t.Errorf("README.md's row for --%s does not give the default %s: %s", s.Flag, def, row)
		}
	}
	for f := range rows {
		if _, ok := byFlag[f]; !ok && f != "config" {
			t.Errorf("README.md's settings table names --%s, which is no setting of config.Settings", f)
		}
	}
}
