package dir

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/sources"
)

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// writeTree creates files (path -> content) below dir.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, data := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSnapshot(t *testing.T) {
	ctx := testContext(t)
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"base/cm.yaml":          "kind: ConfigMap\n",
		"overlay/kustomization": "resources: [../base]\n",
		".git/HEAD":             "ref: refs/heads/main\n",
	})
	if err := os.Symlink("../base/cm.yaml", filepath.Join(root, "overlay", "cm.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("base", filepath.Join(root, "base-link")); err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Path: root})
	if err != nil {
		t.Fatal(err)
	}
	art, err := s.Fetch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{
		"base/cm.yaml": "kind: ConfigMap\n", "overlay/cm.yaml": "kind: ConfigMap\n", "base-link/cm.yaml": "kind: ConfigMap\n",
	} {
		if got, err := fs.ReadFile(art.FS, p); err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", p, got, err, want)
		}
	}
	if _, err := fs.Stat(art.FS, ".git"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf(".git is in the artifact (%v); it must be skipped", err)
	}
	if !strings.HasPrefix(art.Revision, "sha256:") || len(art.Revision) != len("sha256:")+64 {
		t.Errorf("revision = %q, want sha256:<64 hex>", art.Revision)
	}

	// Timestamps are not content; bytes are.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(root, "base/cm.yaml"), later, later); err != nil {
		t.Fatal(err)
	}
	if rev, err := s.Revision(ctx); err != nil || rev != art.Revision {
		t.Errorf("Revision after a touch = %q, %v; want unchanged %q", rev, err, art.Revision)
	}
	writeTree(t, root, map[string]string{"base/cm.yaml": "kind: ConfigMap # edited\n"})
	if rev, err := s.Revision(ctx); err != nil || rev == art.Revision {
		t.Errorf("Revision after an edit = %q, %v; want a new one", rev, err)
	}
}

func TestSnapshotRefuses(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, root string) error
		want  string
	}{
		{"a symlink out of the directory", func(t *testing.T, root string) error {
			return os.Symlink("../../etc/passwd", filepath.Join(root, "passwd"))
		}, "points outside the artifact root"},
		{"an absolute symlink", func(t *testing.T, root string) error {
			return os.Symlink("/etc", filepath.Join(root, "etc"))
		}, "absolute path /etc"},
		{"a symlink into a parent directory", func(t *testing.T, root string) error {
			writeTree(t, root, map[string]string{"a/x.yaml": "x"})
			return os.Symlink("..", filepath.Join(root, "a", "up"))
		}, "contains it"},
		{"a named pipe", func(t *testing.T, root string) error {
			return syscall.Mkfifo(filepath.Join(root, "pipe"), 0o644)
		}, "a named pipe"},
		{"a file over the limit", func(t *testing.T, root string) error {
			writeTree(t, root, map[string]string{"big.yaml": strings.Repeat("x", 2048)})
			return nil
		}, "limit of 1024 bytes per file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			writeTree(t, root, map[string]string{"ok.yaml": "ok"})
			if err := tt.setup(t, root); err != nil {
				t.Fatal(err)
			}
			_, err := Snapshot(testContext(t), root, sources.Limits{MaxFileBytes: 1024})
			if !errors.Is(err, sources.ErrRefused) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Snapshot = %v, want ErrRefused containing %q", err, tt.want)
			}
			if !strings.Contains(err.Error(), root) {
				t.Errorf("Snapshot = %v, want it to name the directory", err)
			}
		})
	}
}

func TestNewRefuses(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	writeTree(t, filepath.Dir(file), map[string]string{"f": ""})
	for _, tt := range []struct {
		path string
		want error
	}{{"", sources.ErrInvalid}, {file, sources.ErrInvalid}, {filepath.Join(file, "missing"), sources.ErrInvalid}, {"/nonexistent/capstan", sources.ErrNotFound}} {
		if _, err := New(Options{Path: tt.path}); !errors.Is(err, tt.want) {
			t.Errorf("New(%q) = %v, want %v", tt.path, err, tt.want)
		}
	}
}
