package git

import (
	"errors"
	"io/fs"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/sources"
)

func link(path, target string) gitserver.File {
	return gitserver.File{Path: path, Content: target, Symlink: true}
}

func file(path, content string) gitserver.File {
	return gitserver.File{Path: path, Content: content}
}

// TestSymlinks pins how the commit tree becomes an artifact: a symlink
// that stays inside the repository becomes a copy of its target, anything
// else refuses the whole artifact, naming the link.
func TestSymlinks(t *testing.T) {
	base := []gitserver.File{
		file("base/cluster.yaml", "kind: Cluster\n"),
		file("base/hosts/bmh.yaml", "kind: BareMetalHost\n"),
	}
	tests := []struct {
		name  string
		files []gitserver.File
		want  map[string]string // extra files besides base; nil when refused
		error string
	}{
		{
			name:  "a link to a file in the same directory",
			files: []gitserver.File{link("base/alias.yaml", "cluster.yaml")},
			want:  map[string]string{"base/alias.yaml": "kind: Cluster\n"},
		},
		{
			name:  "a link up and across",
			files: []gitserver.File{link("overlays/prod/cluster.yaml", "../../base/cluster.yaml")},
			want:  map[string]string{"overlays/prod/cluster.yaml": "kind: Cluster\n"},
		},
		{
			name:  "a chain of links",
			files: []gitserver.File{link("a", "b"), link("b", "base/cluster.yaml")},
			want:  map[string]string{"a": "kind: Cluster\n", "b": "kind: Cluster\n"},
		},
		{
			name:  "a link to a directory is copied as a directory",
			files: []gitserver.File{link("overlays/prod/base", "../../base")},
			want: map[string]string{
				"overlays/prod/base/cluster.yaml":   "kind: Cluster\n",
				"overlays/prod/base/hosts/bmh.yaml": "kind: BareMetalHost\n",
			},
		},
		{
			name:  "a link through a linked directory",
			files: []gitserver.File{link("b", "base"), link("bmh.yaml", "b/hosts/bmh.yaml")},
			want: map[string]string{
				"b/cluster.yaml":   "kind: Cluster\n",
				"b/hosts/bmh.yaml": "kind: BareMetalHost\n",
				"bmh.yaml":         "kind: BareMetalHost\n",
			},
		},
		{
			name:  "a submodule is skipped",
			files: []gitserver.File{{Path: "vendor/lib", Content: strings.Repeat("ab", 20), Gitlink: true}},
			want:  map[string]string{},
		},
		{
			name:  "an executable stays a regular file",
			files: []gitserver.File{{Path: "hack/run.sh", Content: "#!/bin/sh\n", Executable: true}},
			want:  map[string]string{"hack/run.sh": "#!/bin/sh\n"},
		},
		{
			name:  "a link that climbs out of the repository",
			files: []gitserver.File{link("base/passwd", "../../../../etc/passwd")},
			error: "symlink base/passwd: content refused: points outside the artifact root",
		},
		{
			name:  "a link to an absolute path",
			files: []gitserver.File{link("base/passwd", "/etc/passwd")},
			error: "symlink base/passwd: content refused: points to the absolute path /etc/passwd",
		},
		{
			name:  "a link that escapes through another link",
			files: []gitserver.File{link("up", ".."), link("base/passwd", "../up/etc/passwd")},
			error: "points outside the artifact root",
		},
		{
			name:  "a dangling link",
			files: []gitserver.File{link("base/gone.yaml", "missing.yaml")},
			error: "points to base/missing.yaml, which does not exist",
		},
		{
			name:  "a loop of links",
			files: []gitserver.File{link("a", "b"), link("b", "a")},
			error: "more than 40 symlinks",
		},
		{
			name:  "a link to its own directory",
			files: []gitserver.File{link("base/self", ".")},
			error: "symlink base/self: content refused: points to base, which contains it",
		},
		{
			name:  "a link to the root",
			files: []gitserver.File{link("base/root", "..")},
			error: "points to the artifact root, which contains it",
		},
		{
			name:  "two directories linked into each other",
			files: []gitserver.File{link("x/to-y", "../y"), link("y/to-x", "../x")},
			error: "which contains it",
		},
		{
			name:  "a link through a file",
			files: []gitserver.File{link("base/bad", "cluster.yaml/x")},
			error: "passes through base/cluster.yaml, which is not a directory",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			repo, _ := newRepo(t, map[string]string{})
			if _, err := server.CommitFiles(repo, "main", append(base, tt.files...), tt.name); err != nil {
				t.Fatal(err)
			}
			art, err := httpSource(t, repo).Fetch(ctx)
			if tt.want == nil {
				if !errors.Is(err, sources.ErrRefused) || !strings.Contains(err.Error(), tt.error) {
					t.Fatalf("Fetch = %v, want sources.ErrRefused saying %q", err, tt.error)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]string{
				"base/cluster.yaml":   "kind: Cluster\n",
				"base/hosts/bmh.yaml": "kind: BareMetalHost\n",
			}
			for p, c := range tt.want {
				want[p] = c
			}
			assertFiles(t, art.FS, want)
			err = fs.WalkDir(art.FS, ".", func(p string, d fs.DirEntry, err error) error {
				if err == nil && !d.IsDir() && !d.Type().IsRegular() {
					t.Errorf("%s has mode %v, want a regular file", p, d.Type())
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
