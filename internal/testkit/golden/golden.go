// Package golden compares what a test produced with a golden file kept in
// the test's testdata folder, byte for byte, and rewrites the file when the
// test runs with -update:
//
//	go test -run TestStatusGolden ./cmd/walcount -update
//
// (name the packages: a package whose tests do not import golden refuses
// the flag). A mismatch fails the test with a diff of the lines, want
// (the file) against got, so that a change of the output shows as what
// changed. Review the diff of the files that -update wrote before
// committing them: they are what the output was agreed to be.
//
// It is part of the test kit (internal/testkit): for walcount's own tests;
// not a stable API.
package golden

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ with what the tests produce")

// Updating reports whether the test binary runs with -update.
func Updating() bool { return *update }

// Check compares got with testdata/name, or writes it there with -update.
func Check(t testing.TB, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", filepath.FromSlash(name))
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", path)
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden file %s: %v (run the test with -update to write it, then review it)", path, err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the output differs from %s (- the golden file, + the output; run the test with -update to accept it):\n%s",
			path, Diff(string(want), string(got)))
	}
}

// Replacer normalises what varies between runs: each rule replaces the
// matches of its pattern by its placeholder (with $1 and the like
// expanded), in order.
type Replacer []Rule

// Rule is one replacement of a Replacer.
type Rule struct {
	Pattern     *regexp.Regexp
	Placeholder string
}

// Literal is a Rule that replaces the text s, when it is not empty, as a
// whole word: a name such as postgres is not replaced inside postgresql.
func Literal(s, placeholder string) Rule {
	if s == "" {
		return Rule{}
	}
	pattern := regexp.QuoteMeta(s)
	if word.MatchString(s[:1]) {
		pattern = `\b` + pattern
	}
	if word.MatchString(s[len(s)-1:]) {
		pattern += `\b`
	}
	return Rule{regexp.MustCompile(pattern), strings.ReplaceAll(placeholder, "$", "$$")}
}

var word = regexp.MustCompile(`\w`)

// Apply returns s with every rule applied.
func (r Replacer) Apply(s string) string {
	for _, rule := range r {
		if rule.Pattern != nil {
			s = rule.Pattern.ReplaceAllString(s, rule.Placeholder)
		}
	}
	return s
}

// Diff returns a line diff of want and got: lines only in want start with
// "- ", lines only in got with "+ ", and up to 3 lines of context either
// side of a change start with "  "; "@@ line N" starts each hunk (N counts
// the lines of want). A missing final newline shows as a line of its own.
func Diff(want, got string) string {
	a, b := lines(want), lines(got)
	// The longest common subsequence, by dynamic programming: the files
	// are a few hundred lines at most.
	lcs := make([][]int, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	type op struct {
		kind byte // ' ', '-', '+'
		text string
		line int // in want
	}
	var ops []op
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			ops = append(ops, op{' ', a[i], i + 1})
			i, j = i+1, j+1
		case j < len(b) && (i == len(a) || lcs[i][j+1] > lcs[i+1][j]):
			ops = append(ops, op{'+', b[j], i + 1})
			j++
		default:
			ops = append(ops, op{'-', a[i], i + 1})
			i++
		}
	}
	const context = 3
	show := make([]bool, len(ops))
	for k, o := range ops {
		if o.kind != ' ' {
			for c := max(0, k-context); c <= min(len(ops)-1, k+context); c++ {
				show[c] = true
			}
		}
	}
	var out strings.Builder
	for k, o := range ops {
		if !show[k] {
			continue
		}
		if k == 0 || !show[k-1] {
			fmt.Fprintf(&out, "@@ line %d\n", o.line)
		}
		fmt.Fprintf(&out, "%c %s\n", o.kind, o.text)
	}
	return out.String()
}

// lines splits s into its lines, the last one marked when it lacks its
// newline.
func lines(s string) []string {
	if s == "" {
		return nil
	}
	l := strings.Split(s, "\n")
	if l[len(l)-1] == "" {
		return l[:len(l)-1]
	}
	l[len(l)-1] += " (no newline at the end)"
	return l
}
