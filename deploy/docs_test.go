package deploy_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// alertNames returns the name of every alert of prometheus/alerts.yml.
func alertNames(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatalf("parse alerts.yml: %v", err)
	}
	var names []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				names = append(names, r.Alert)
			}
		}
	}
	return names
}

// TestTroubleshootingCoversEveryAlert: docs/troubleshooting.md has a
// section (### `Name`) for every alert the rules ship, saying what it means
// and what to do, and no section for an alert that does not exist.
func TestTroubleshootingCoversEveryAlert(t *testing.T) {
	b, err := os.ReadFile("../docs/troubleshooting.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	names := alertNames(t)
	if len(names) < 20 {
		t.Fatalf("alerts.yml has %d alerts: the parse found too few", len(names))
	}
	for _, n := range names {
		i := strings.Index(doc, "### `"+n+"`\n")
		if i < 0 {
			t.Errorf("docs/troubleshooting.md has no section ### `%s`", n)
			continue
		}
		section := doc[i+1:]
		if j := strings.Index(section, "\n#"); j >= 0 {
			section = section[:j]
		}
		if !strings.Contains(section, "**Means:**") || !strings.Contains(section, "**Do:**") {
			t.Errorf("docs/troubleshooting.md's section on %s does not say what it means and what to do", n)
		}
	}
	for _, m := range regexp.MustCompile("(?m)^### `(Walcount[A-Za-z]+)`$").FindAllStringSubmatch(doc, -1) {
		found := false
		for _, n := range names {
			found = found || n == m[1]
		}
		if !found {
			t.Errorf("docs/troubleshooting.md documents %s, which alerts.yml does not ship", m[1])
		}
	}
}

// TestDocsIndex: docs/README.md links every page of docs/, and every
// relative link of the pages of docs/ (and of the README) names a file
// that exists: nothing a user reads points nowhere.
func TestDocsIndex(t *testing.T) {
	pages, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	index, err := os.ReadFile("../docs/README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pages {
		name := filepath.Base(p)
		if name != "README.md" && !strings.Contains(string(index), "]("+name) {
			t.Errorf("docs/README.md does not link %s", name)
		}
	}
	link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)
	for _, p := range append(pages, "../README.md") {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				t.Errorf("%s links outside the repository: %s", p, target)
				continue
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(p), target)); err != nil {
				t.Errorf("%s links %s, which does not exist", p, target)
			}
		}
	}
}
