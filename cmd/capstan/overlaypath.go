package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// rootFlagUsage is the help of --root, shared by render, validate and
// diff.
const rootFlagUsage = "directory that plays the source artifact's root (kustomize reads nothing outside it, as in the daemon); " +
	"default: the git repository holding PATH, else the current directory when it holds PATH, else PATH itself. " +
	"With --root, a relative PATH is relative to it"

// overlay is where an overlay given on the command line lives: the
// directory that plays the artifact's root and the overlay's path inside
// it, as a ClusterDeployment's spec.path would name it.
type overlay struct {
	root string
	path string
}

// locateOverlay resolves PATH as the user typed it. With --root (root
// set), a relative PATH is relative to the root, as a spec.path is, and
// an absolute one must lie under it. Without, PATH is a path on this
// machine, absolute or relative to the current directory, and the root
// is the git repository that holds it: the artifact the daemon would
// fetch. So `capstan validate /abs/repo/clusters/a`, `capstan validate
// ../clusters/a` from a sibling directory and `capstan validate
// clusters/a` from the repository's top check the same files and print
// the same report.
func locateOverlay(root, path string) (overlay, error) {
	if root != "" {
		if !filepath.IsAbs(path) {
			return overlay{root: root, path: path}, nil
		}
		absRoot, err := filepath.Abs(root)
		if err != nil {
			return overlay{}, fmt.Errorf("--root %s: %w", root, err)
		}
		rel, ok := inside(absRoot, path)
		if !ok {
			return overlay{}, fmt.Errorf("%s is not under --root %s: give a PATH inside it, or a --root that holds it", path, root)
		}
		return overlay{root: root, path: rel}, nil
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return overlay{}, fmt.Errorf("%s: %w", path, err)
	}
	info, err := os.Stat(abs)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return overlay{}, fmt.Errorf("%s: no such directory (PATH is the kustomize overlay's directory)", path)
		}
		return overlay{}, fmt.Errorf("%s: %w", path, err)
	}
	if !info.IsDir() {
		return overlay{}, fmt.Errorf("%s is a file: PATH is the directory of a kustomize overlay (its kustomization.yaml's directory)", path)
	}
	top := repositoryTop(abs)
	if top == "" {
		if cwd, err := os.Getwd(); err == nil {
			if _, ok := inside(cwd, abs); ok {
				top = cwd
			}
		}
	}
	if top == "" {
		top = abs
	}
	rel, _ := inside(top, abs)
	return overlay{root: top, path: rel}, nil
}

// inside returns path relative to dir, slash-separated as a spec.path
// is, and whether path lies under dir (dir itself included, as ".").
func inside(dir, path string) (string, bool) {
	rel, err := filepath.Rel(filepath.Clean(dir), filepath.Clean(path))
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
		return "", false
	}
	return filepath.ToSlash(rel), true
}

// repositoryTop is the top directory of the git repository (or worktree,
// whose .git is a file) holding dir; "" outside any. It reads the file
// system only, so it needs no git binary.
func repositoryTop(dir string) string {
	for d := dir; ; {
		if _, err := os.Lstat(filepath.Join(d, ".git")); err == nil {
			return d
		}
		parent := filepath.Dir(d)
		if parent == d {
			return ""
		}
		d = parent
	}
}
