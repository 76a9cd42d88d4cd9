package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/capstan-dev/capstan"

// layer is one row of the dependency rule: the packages under a tree and the
// trees of this module they may import. A package not under any layer's tree
// is bound only by the rules every package keeps (nothing imports e2e or
// cmd).
type layer struct {
	tree string
	// mayImport lists the trees of this module the layer's code may import;
	// its own tree is always allowed.
	mayImport []string
	// testsMayAlsoImport lists trees only its tests may import: the real
	// servers and control planes under internal/ are test machinery, never
	// part of what the layer ships.
	testsMayAlsoImport []string
}

// rule is docs/architecture.md's "Imports" paragraph as a table:
// cmd -> reconciler -> {sources, render, stages} -> {api, failure}; sources,
// render and stages never import each other; failure imports nothing of
// Capstan. The order of the rows is the order of the arrows.
var rule = []layer{
	{tree: "failure"},
	{tree: "api"},
	{tree: "sources", mayImport: []string{"failure"}, testsMayAlsoImport: []string{"internal"}},
	{tree: "render", mayImport: []string{"failure"}, testsMayAlsoImport: []string{"internal"}},
	{tree: "stages", mayImport: []string{"api", "failure"}, testsMayAlsoImport: []string{"internal"}},
	{
		tree:               "reconciler",
		mayImport:          []string{"api", "failure", "sources", "render", "stages"},
		testsMayAlsoImport: []string{"internal"},
	},
}

// nobodyImports are the trees no other tree imports, tests included: the
// end-to-end suites and the binary are the top of the graph.
var nobodyImports = []string{"e2e", "cmd"}

// pkg is what the test reads of `go list -json`.
type pkg struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// TestDependencyRule fails for every import that breaks the rule, naming
// the importing package, the imported one and the row it breaks.
func TestDependencyRule(t *testing.T) {
	pkgs := listPackages(t)
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages of %s; expected the whole module", len(pkgs), module)
	}
	var problems []string
	for _, p := range pkgs {
		problems = append(problems, check(p)...)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// TestRuleCatchesForbiddenImports keeps the checker honest: each row is an
// import the rule forbids, and check must name it.
func TestRuleCatchesForbiddenImports(t *testing.T) {
	cases := []struct {
		name string
		p    pkg
	}{
		{"stages never imports reconciler", pkg{ImportPath: module + "/stages", Imports: []string{module + "/reconciler"}}},
		{"sources never imports render", pkg{ImportPath: module + "/sources/git", Imports: []string{module + "/render"}}},
		{"render never imports stages", pkg{ImportPath: module + "/render", Imports: []string{module + "/stages/pivot"}}},
		{"failure imports nothing of Capstan", pkg{ImportPath: module + "/failure", Imports: []string{module + "/api/v1alpha1"}}},
		{"shipped code never imports test servers", pkg{ImportPath: module + "/stages/pivot", Imports: []string{module + "/internal/testenv"}}},
		{"nothing imports e2e", pkg{ImportPath: module + "/internal/sim", TestImports: []string{module + "/e2e/cluster"}}},
		{"a tree's name is a whole path element", pkg{ImportPath: module + "/sourcesx", Imports: []string{module + "/cmd/capstan"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := check(c.p); len(got) == 0 {
				t.Fatalf("check(%+v) found nothing", c.p)
			}
		})
	}
	allowed := []pkg{
		{ImportPath: module + "/sources/git", Imports: []string{module + "/sources", module + "/failure"}, TestImports: []string{module + "/internal/gitserver"}},
		{ImportPath: module + "/reconciler", Imports: []string{module + "/stages/pivot", module + "/render", module + "/api/v1alpha1"}},
		{ImportPath: module + "/cmd/capstan", Imports: []string{module + "/reconciler", module + "/internal/testenv"}},
	}
	for _, p := range allowed {
		if got := check(p); len(got) != 0 {
			t.Errorf("check(%s) = %v; want no problem", p.ImportPath, got)
		}
	}
}

// check returns one line per import of p that breaks the rule.
func check(p pkg) []string {
	from, ok := strings.CutPrefix(p.ImportPath, module+"/")
	if !ok {
		return nil
	}
	var problems []string
	forbid := func(imp, why string) {
		problems = append(problems, fmt.Sprintf("%s imports %s: %s (docs/architecture.md, Imports)", from, imp, why))
	}
	visit := func(imports []string, test bool) {
		for _, full := range imports {
			imp, ok := strings.CutPrefix(full, module+"/")
			if !ok || imp == from {
				continue
			}
			for _, top := range nobodyImports {
				if under(imp, top) && !under(from, top) {
					forbid(imp, "nothing imports "+top+"/")
				}
			}
			l, ok := layerOf(from)
			if !ok || under(imp, l.tree) || slices.ContainsFunc(l.mayImport, func(t string) bool { return under(imp, t) }) {
				continue
			}
			if test && slices.ContainsFunc(l.testsMayAlsoImport, func(t string) bool { return under(imp, t) }) {
				continue
			}
			allowed := strings.Join(l.mayImport, ", ")
			if allowed == "" {
				allowed = "nothing of Capstan"
			}
			where := "its code"
			if test {
				where = "its tests"
			}
			forbid(imp, fmt.Sprintf("%s/ may import only %s (%s)", l.tree, allowed, where))
		}
	}
	visit(p.Imports, false)
	visit(p.TestImports, true)
	visit(p.XTestImports, true)
	return problems
}

func layerOf(path string) (layer, bool) {
	for _, l := range rule {
		if under(path, l.tree) {
			return l, true
		}
	}
	return layer{}, false
}

// under reports whether path is tree or below it, by whole path elements.
func under(path, tree string) bool {
	return path == tree || strings.HasPrefix(path, tree+"/")
}

// listPackages runs `go list -json ./...` at the module root: only the
// module's own packages, no dependency loaded, so it costs about a second.
func listPackages(t *testing.T) []pkg {
	t.Helper()
	// go test runs a package's tests in its directory: the root is two up.
	root := filepath.Join("..", "..")
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := exec.LookPath(goBin); err != nil {
		goBin = "go"
	}
	cmd := exec.CommandContext(t.Context(), goBin, "list", "-e", "-json=ImportPath,Imports,TestImports,XTestImports", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list in %s: %v\n%s", root, err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}
