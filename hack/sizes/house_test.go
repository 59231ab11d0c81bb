package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// root is the repository, two levels up from hack/sizes.
const root = "../.."

// TestReadmePathsExist keeps the README's path of a label change and its
// three answers (which pods go, where the reboot is decided, how a record
// reaches the Node) pointing at files that exist, one file an answer, the
// file that holds it.
func TestReadmePathsExist(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(src)
	start := strings.Index(text, "The path of one label change")
	if start < 0 {
		t.Fatal("README.md has no paragraph on the path of one label change")
	}
	end := strings.Index(text[start:], "\n\n")
	if end < 0 {
		end = len(text) - start
	}
	para := text[start : start+end]
	files := regexp.MustCompile("`([a-z0-9_/]+\\.go)`").FindAllStringSubmatch(para, -1)
	if len(files) < 8 {
		t.Fatalf("the paragraph names %d files, want the whole path and the three answers", len(files))
	}
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(root, f[1])); err != nil {
			t.Errorf("README.md names %s: %v", f[1], err)
		}
	}
	// Each answer names one file, and that file holds what answers it.
	flat := strings.Join(strings.Fields(para), " ")
	for _, a := range []struct{ q, holds string }{
		{"which pods a change affects", "func (d *Disruptor) Affected("},
		{"where the reboot is decided", "func (a *attempt) rebootFor("},
		{"how a change's record reaches the Node", "func (k *Cluster) Record("},
	} {
		i := strings.Index(flat, a.q)
		if i < 0 {
			t.Errorf("the paragraph no longer answers %q", a.q)
			continue
		}
		answer := flat[i+len(a.q):]
		if end := strings.IndexAny(answer, ";"); end >= 0 {
			answer = answer[:end]
		}
		named := regexp.MustCompile("`([a-z0-9_/]+\\.go)`").FindAllStringSubmatch(answer, -1)
		if len(named) != 1 {
			t.Errorf("%q is answered by %d files, want one", a.q, len(named))
			continue
		}
		body, err := os.ReadFile(filepath.Join(root, named[0][1]))
		if err != nil || !strings.Contains(string(body), a.holds) {
			t.Errorf("%q: %s does not hold %s (%v)", a.q, named[0][1], a.holds, err)
		}
	}
}

// TestSizeLimits holds the house to its limits: no package over 2,500
// non-test lines, no product function over 100.
func TestSizeLimits(t *testing.T) {
	pkgs, funcs, err := measure(root)
	if err != nil {
		t.Fatal(err)
	}
	for d, n := range pkgs {
		if n > 2500 {
			t.Errorf("package %s has %d non-test lines, over 2,500", d, n)
		}
	}
	for _, f := range funcs {
		if f.lines > 100 {
			t.Errorf("%s (%s) has %d lines, over 100", f.name, f.pos, f.lines)
		}
	}
}

// TestLayering keeps the rooms' imports as docs say: record links only the
// standard library, the core no Prometheus, drain no NVML.
func TestLayering(t *testing.T) {
	deps := func(pkg string) []string {
		cmd := exec.Command("go", "list", "-deps", pkg)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		return strings.Fields(string(out))
	}
	for _, p := range deps("./record") {
		first, _, _ := strings.Cut(p, "/")
		if strings.Contains(first, ".") && p != "github.com/migagent/mig-agent/record" {
			t.Errorf("record links %s; it must link only the standard library", p)
		}
	}
	for _, c := range []struct{ pkg, banned string }{
		// The planner is a client of what agents publish (package
		// published): it links neither the agent's core and its rooms,
		// nor NVML, nor the machinery of the agent's own client.
		{"./planner", "mig-agent/reconcile"},
		{"./planner", "mig-agent/kube"},
		{"./planner", "mig-agent/gpus"},
		{"./planner", "mig-agent/nvmlx"},
		{"./planner", "mig-agent/journal"},
		{"./planner", "go-nvml"},
		{"./planner", "client-go/gentype"},
		{"./planner", "client_golang"},
		{"./published", "mig-agent/reconcile"},
		{"./published", "mig-agent/kube"},
		{"./published", "go-nvml"},
		// The view `mig-agent status` shows is a reader's too.
		{"./published/status", "mig-agent/reconcile"},
		{"./published/status", "mig-agent/kube"},
		{"./published/status", "go-nvml"},
		{"./reconcile", "prometheus"},
		{"./drain", "go-nvml"},
		{"./drain", "client_golang"},
	} {
		for _, p := range deps(c.pkg) {
			if strings.Contains(p, c.banned) {
				t.Errorf("%s links %s", c.pkg, p)
			}
		}
	}
	// The planner's weight: at most 150 packages outside the standard
	// library (253 when it linked the agent's rooms).
	n := 0
	for _, p := range deps("./planner") {
		if first, _, _ := strings.Cut(p, "/"); strings.Contains(first, ".") {
			n++
		}
	}
	if n > 150 {
		t.Errorf("the planner links %d packages outside the standard library, over 150", n)
	}
}

// TestOnePlacePerChore keeps each Kubernetes chore in its one package:
// no product file but internal/kevent's builds an Event.
func TestOnePlacePerChore(t *testing.T) {
	for _, c := range []struct{ pattern, home string }{
		{"corev1.Event{", "internal/kevent"},
	} {
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			if strings.HasPrefix(rel, c.home+"/") || strings.HasPrefix(rel, "internal/kclient/") || strings.HasPrefix(rel, "e2e/") || strings.HasPrefix(rel, "testkit/") {
				return nil
			}
			src, err := os.ReadFile(path)
			if err == nil && strings.Contains(string(src), c.pattern) {
				t.Errorf("%s builds %s; only %s does", rel, c.pattern, c.home)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// module is the import path of the repository's module.
const module = "github.com/migagent/mig-agent/"

// TestTestKitApart keeps test support in its own wing and the floors below
// the rooms: no product file (outside testkit/, e2e/ and hack/, and not a
// _test.go file) imports testkit/; internal/ holds product helpers that
// import nothing of the module but internal/ and record (the leaf), so no
// import runs back up the house; and among the code that serves tests,
// only testkit/ reaches into the core (hack/'s benches and demo go through
// it). Every .go file is read, whatever its build tags, so a tagged file
// cannot hide an import. Modules of their own below the root are not this
// module's packages and are left out.
func TestTestKitApart(t *testing.T) {
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != root {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		checked++
		for _, is := range f.Imports {
			for _, msg := range wingRule(rel, strings.Trim(is.Path.Value, `"`)) {
				t.Errorf("%s: %s", rel, msg)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("read %d non-test files; the walk missed the tree", checked)
	}
}

// wingRule returns what is wrong with the non-test file rel (a path from
// the root) importing imp.
func wingRule(rel, imp string) []string {
	pkg, ok := strings.CutPrefix(imp, module)
	if !ok {
		return nil
	}
	under := func(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
	wing := under(rel, "testkit") || under(rel, "e2e") || under(rel, "hack")
	var bad []string
	if under(pkg, "testkit") && !wing {
		bad = append(bad, "a product file imports "+pkg+"; the test wing is for tests, benches and harnesses only")
	}
	if under(rel, "internal") && !under(pkg, "internal") && pkg != "record" {
		bad = append(bad, "internal/ imports "+pkg+"; the floor under the rooms imports only internal/ and record")
	}
	if (under(rel, "internal") || under(rel, "hack")) && under(pkg, "reconcile") {
		bad = append(bad, "imports the core ("+pkg+"); of the code that serves tests only testkit/ may")
	}
	return bad
}

// TestPortWidths keeps the core's ports narrow: no interface in
// reconcile/ports.go has more than 8 methods (Disruptor had 11, Metrics 15
// and Cluster 10).
func TestPortWidths(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, "reconcile", "ports.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok {
			return true
		}
		const limit = 8
		if it, ok := ts.Type.(*ast.InterfaceType); ok && it.Methods.NumFields() > limit {
			t.Errorf("port %s has %d methods, over %d", ts.Name.Name, it.Methods.NumFields(), limit)
		}
		return false
	})
}
