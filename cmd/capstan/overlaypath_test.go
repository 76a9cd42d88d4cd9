package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// overlayRepo copies testdata/validate into clusters/ of a new repository
// (a directory with .git) and returns the repository's top.
func overlayRepo(t *testing.T) string {
	t.Helper()
	top := t.TempDir()
	if err := os.CopyFS(filepath.Join(top, "clusters"), os.DirFS("testdata/validate")); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{".git", "docs"} {
		if err := os.Mkdir(filepath.Join(top, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return top
}

// TestValidateTakesAnOverlayAsTheUserTypesIt: an absolute path, a ../
// path, a path inside the repository and "." from the overlay itself
// check the same files against the same root (the repository), so they
// print the same report. Before, all but the path relative to the
// current directory failed ("must be relative to the artifact root",
// "leaves the artifact root"), and the bad overlay's ../good could not
// be read from inside it.
func TestValidateTakesAnOverlayAsTheUserTypesIt(t *testing.T) {
	top := overlayRepo(t)
	cases := []struct {
		name, dir, path string
	}{
		{"inside the repository", top, "clusters/bad"},
		{"absolute", filepath.Join(top, "docs"), filepath.Join(top, "clusters", "bad")},
		{"from a sibling directory", filepath.Join(top, "docs"), "../clusters/bad"},
		{"the overlay itself", filepath.Join(top, "clusters", "bad"), "."},
	}
	var want string
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Chdir(c.dir)
			out, err := runCLI(t, "validate", c.path)
			if err == nil || !strings.Contains(err.Error(), "validate "+c.path+": preflight found") {
				t.Fatalf("validate %s from %s: error %v, want the preflight's problems of %s", c.path, c.dir, err, c.path)
			}
			// bad patches ../good: its problems are there only if the
			// root holds both.
			if !strings.Contains(out, "5 errors, 3 warnings in 3 objects checked") {
				t.Errorf("the report is not the one of clusters/bad over clusters/good:\n%s", out)
			}
			if i == 0 {
				want = out
			} else if out != want {
				t.Errorf("validate %s from %s printed\n%s\nwant the report of clusters/bad from the top:\n%s", c.path, c.dir, out, want)
			}
		})
	}
}

// TestRenderTakesAnAbsolutePathUnderRoot: with --root, an absolute PATH
// under it is the same overlay as its relative path, and one outside it
// is refused naming both.
func TestRenderTakesAnAbsolutePathUnderRoot(t *testing.T) {
	top := overlayRepo(t)
	root := filepath.Join(top, "clusters")
	rel, err := runCLI(t, "render", "--root", root, "good")
	if err != nil {
		t.Fatalf("render good: %v\n%s", err, rel)
	}
	abs, err := runCLI(t, "render", "--root", root, filepath.Join(root, "good"))
	if err != nil {
		t.Fatalf("render %s: %v\n%s", filepath.Join(root, "good"), err, abs)
	}
	if abs != rel {
		t.Errorf("an absolute PATH under --root rendered\n%s\nwant what its relative path renders:\n%s", abs, rel)
	}
	outside := t.TempDir()
	_, err = runCLI(t, "render", "--root", root, outside)
	if err == nil || !strings.Contains(err.Error(), "is not under --root "+root) {
		t.Errorf("render --root %s %s: error %v, want one saying it is not under --root", root, outside, err)
	}
}

func TestLocateOverlay(t *testing.T) {
	top := overlayRepo(t)
	plain, other := t.TempDir(), t.TempDir() // no repository: the current directory or PATH is the root
	for _, dir := range []string{filepath.Join(plain, "a", "b"), filepath.Join(other, "c")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(plain)
	cases := []struct {
		name, root, path string
		want             overlay
		err              string
	}{
		{name: "relative to --root", root: "x", path: "a/b", want: overlay{root: "x", path: "a/b"}},
		{name: "in a repository", path: filepath.Join(top, "clusters", "good"), want: overlay{root: top, path: "clusters/good"}},
		{name: "the repository's top", path: top, want: overlay{root: top, path: "."}},
		{name: "under the current directory", path: "a/b", want: overlay{root: plain, path: "a/b"}},
		{name: "under the current directory by ..", path: filepath.Join(top, "..", filepath.Base(plain), "a"), want: overlay{root: plain, path: "a"}},
		{name: "outside the current directory", path: filepath.Join(other, "c"), want: overlay{root: filepath.Join(other, "c"), path: "."}},
		{name: "missing", path: "nope", err: "no such directory"},
		{name: "a file", path: filepath.Join(top, "clusters", "bad.txt"), err: "is a file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := locateOverlay(c.root, c.path)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("locateOverlay(%q, %q) = %+v, want %+v", c.root, c.path, got, c.want)
			}
		})
	}
}
