package golden

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDiff(t *testing.T) {
	want := "a\nb\nc\nd\ne\nf\ng\nh\ni\nk\nl\nm\n"
	got := "a\nb\nc\nd\nE\nf\ng\nh\ni\nk\nl\nm\nn"
	const diff = `@@ line 2
  b
  c
  d
- e
+ E
  f
  g
  h
@@ line 10
  k
  l
  m
+ n (no newline at the end)
`
	if d := Diff(want, got); d != diff {
		t.Errorf("Diff =\n%s\nwant\n%s", d, diff)
	}
	if d := Diff(want, want); d != "" {
		t.Errorf("Diff of equal texts = %q", d)
	}
}

func TestLiteralIsAWholeWord(t *testing.T) {
	r := Replacer{Literal("postgres", "<role>"), Literal("", "<none>"), Literal("0/1$", "<x$1>")}
	got := r.Apply(`role postgres, postgres_exporter, "postgres"; 0/1$`)
	if want := `role <role>, postgres_exporter, "<role>"; <x$1>`; got != want {
		t.Errorf("Apply = %q, want %q", got, want)
	}
}

// TestCheck compares with a file of testdata, and fails with the diff.
func TestCheck(t *testing.T) {
	if Updating() {
		t.Skip("-update would rewrite the file this test compares with")
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "testdata"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "testdata", "x.txt"), []byte("one\ntwo\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	Check(t, "x.txt", []byte("one\ntwo\n"))
	var rec recorder
	Check(&rec, "x.txt", []byte("one\nthree\n"))
	if !rec.failed || !strings.Contains(rec.msg, "- two\n+ three\n") || !strings.Contains(rec.msg, "-update") {
		t.Errorf("a mismatch reports %q", rec.msg)
	}
}

// recorder is a testing.TB that records a failure instead of failing.
type recorder struct {
	testing.TB
	failed bool
	msg    string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.failed = true
	r.msg = fmt.Sprintf(format, args...)
}
