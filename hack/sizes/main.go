// Command sizes prints the house's size limits: each package's non-test
// lines and the longest non-test functions. It exits 1 when a package is
// over -max-pkg lines or a function of the product's packages over
// -max-func lines. The product is what users run: the function limit leaves
// out the tools under hack/ and the test wing (testkit/: harnesses,
// stand-ins, test helpers); the package limit holds for every package.
//
//	go run ./hack/sizes [-max-pkg 2500] [-max-func 100] [-top 15]
package main

import (
	"bytes"
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

type fn struct {
	name  string
	pos   string
	lines int
}

func main() {
	maxPkg := flag.Int("max-pkg", 2500, "most non-test lines a package may have")
	maxFunc := flag.Int("max-func", 100, "most lines a non-test function may have")
	top := flag.Int("top", 15, "how many of the longest functions to print")
	flag.Parse()
	root := "."
	if flag.NArg() > 0 {
		root = flag.Arg(0)
	}
	pkgs, funcs, err := measure(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sizes:", err)
		os.Exit(2)
	}
	bad := false
	dirs := make([]string, 0, len(pkgs))
	for d := range pkgs {
		dirs = append(dirs, d)
	}
	sort.Slice(dirs, func(i, j int) bool { return pkgs[dirs[i]] > pkgs[dirs[j]] })
	fmt.Println("non-test lines per package:")
	for _, d := range dirs {
		mark := ""
		if pkgs[d] > *maxPkg {
			mark, bad = "  OVER", true
		}
		fmt.Printf("%6d  %s%s\n", pkgs[d], d, mark)
	}
	sort.Slice(funcs, func(i, j int) bool { return funcs[i].lines > funcs[j].lines })
	fmt.Printf("\nlongest non-test functions:\n")
	for i, f := range funcs {
		if i >= *top && f.lines <= *maxFunc {
			break
		}
		mark := ""
		if f.lines > *maxFunc {
			mark, bad = "  OVER", true
		}
		fmt.Printf("%6d  %s  %s%s\n", f.lines, f.name, f.pos, mark)
	}
	if bad {
		fmt.Printf("\nover the limits (package %d lines, function %d lines)\n", *maxPkg, *maxFunc)
		os.Exit(1)
	}
}

// measure walks the Go packages under root, skipping test files, testdata,
// the end-to-end tests and modules of their own (a go.mod below root).
func measure(root string) (map[string]int, []fn, error) {
	pkgs := map[string]int{}
	var funcs []fn
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "e2e" || name == "bin" || name == "dist") {
				return filepath.SkipDir
			}
			if path != root {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		pkgs[filepath.Dir(path)] += bytes.Count(src, []byte("\n"))
		f, err := parser.ParseFile(fset, path, src, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			start, end := fset.Position(fd.Pos()), fset.Position(fd.End())
			name := fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) > 0 {
				name = recvName(fd.Recv.List[0].Type) + "." + name
			}
			if !product(path) {
				continue
			}
			funcs = append(funcs, fn{name: name, pos: fmt.Sprintf("%s:%d", path, start.Line), lines: end.Line - start.Line + 1})
		}
		return nil
	})
	return pkgs, funcs, err
}

func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.IndexExpr:
		return recvName(t.X)
	case *ast.IndexListExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}

// product reports whether the file at path is part of what users run.
func product(path string) bool {
	path = filepath.ToSlash(filepath.Clean(path))
	for _, p := range []string{"hack/", "testkit/"} {
		if strings.HasPrefix(path, p) || strings.Contains(path, "/"+p) {
			return false
		}
	}
	return true
}
