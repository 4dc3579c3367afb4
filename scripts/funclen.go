//go:build ignore

// funclen lists walcount's product functions longer than 100 and 150 lines:
// every function and method declared in a non-test .go file of the module,
// outside internal/testkit (the test kit is not product code) and scripts/.
//
// Usage, from the repository root:
//
//	go run scripts/funclen.go            # functions over 100 lines, longest first
//	go run scripts/funclen.go -over 150  # another threshold
//	go run scripts/funclen.go -max 150   # exit 1 if any function is over 150 lines
//
// A function's length is the number of source lines from its "func" keyword to
// its closing brace, both included, as gofmt lays it out.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type funcLen struct {
	pos   token.Position
	name  string
	lines int
}

func main() {
	root := flag.String("root", ".", "the module's root folder")
	over := flag.Int("over", 100, "list the functions longer than this many lines")
	max := flag.Int("max", 0, "exit 1 when a function is longer than this many lines (0: never)")
	flag.Parse()

	funcs, err := collect(*root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "funclen:", err)
		os.Exit(2)
	}
	sort.Slice(funcs, func(i, j int) bool {
		if funcs[i].lines != funcs[j].lines {
			return funcs[i].lines > funcs[j].lines
		}
		return funcs[i].pos.String() < funcs[j].pos.String()
	})
	n100, n150, nOver, tooLong := 0, 0, 0, 0
	for _, f := range funcs {
		if f.lines > 100 {
			n100++
		}
		if f.lines > 150 {
			n150++
		}
		if *max > 0 && f.lines > *max {
			tooLong++
		}
		if f.lines > *over {
			nOver++
			fmt.Printf("%4d  %s:%d  %s\n", f.lines, f.pos.Filename, f.pos.Line, f.name)
		}
	}
	fmt.Printf("%d product functions: %d over 100 lines, %d over 150 lines\n", len(funcs), n100, n150)
	if tooLong > 0 {
		fmt.Fprintf(os.Stderr, "funclen: %d functions over %d lines\n", tooLong, *max)
		os.Exit(1)
	}
}

// skipDir reports the folders whose code is not product code.
func skipDir(rel string) bool {
	switch rel {
	case "internal/testkit", "scripts", "vendor", "testdata":
		return true
	}
	base := filepath.Base(rel)
	return base == "testdata" || (strings.HasPrefix(base, ".") && base != ".")
}

func collect(root string) ([]funcLen, error) {
	fset := token.NewFileSet()
	var funcs []funcLen
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if skipDir(rel) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		file, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range file.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			start := fset.Position(fn.Pos())
			end := fset.Position(fn.End())
			start.Filename = rel
			funcs = append(funcs, funcLen{pos: start, name: funcName(fn), lines: end.Line - start.Line + 1})
		}
		return nil
	})
	return funcs, err
}

// funcName names a method after its receiver's type: (*Flusher).Run.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	t := fn.Recv.List[0].Type
	star := ""
	if s, ok := t.(*ast.StarExpr); ok {
		star, t = "*", s.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	if ix, ok := t.(*ast.IndexListExpr); ok {
		t = ix.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return "(" + star + id.Name + ")." + fn.Name.Name
	}
	return fn.Name.Name
}
