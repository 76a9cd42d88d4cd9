package sources

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"testing"
)

func TestSymlinksCopyInto(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		links map[string]string
		want  map[string]string // extra files the links add; nil when refused
		err   string
	}{
		{name: "a file link", files: map[string]string{"base/a": "a"}, links: map[string]string{"over/a": "../base/a"},
			want: map[string]string{"over/a": "a"}},
		{name: "a directory link with a link inside", files: map[string]string{"base/a": "a", "t": "t"},
			links: map[string]string{"base/t": "../t", "copy": "base"},
			want:  map[string]string{"base/t": "t", "copy/a": "a", "copy/t": "t"}},
		{name: "a link through a link", files: map[string]string{"d/x": "x"}, links: map[string]string{"l1": "d", "l2": "l1/x"},
			want: map[string]string{"l1/x": "x", "l2": "x"}},
		{name: "a link to a directory that holds only links", files: map[string]string{"t": "t"},
			links: map[string]string{"only/t": "../t", "copy": "only"},
			want:  map[string]string{"only/t": "t", "copy/t": "t"}},
		{name: "out of the root", links: map[string]string{"a/l": "../../x"}, err: "points outside the artifact root"},
		{name: "through a file", files: map[string]string{"f": "f"}, links: map[string]string{"l": "f/x"}, err: "passes through f, which is not a directory"},
		{name: "to the root", files: map[string]string{"f": "f"}, links: map[string]string{"l": "."}, err: "contains it"},
		{name: "dangling", links: map[string]string{"l": "nowhere"}, err: "does not exist"},
		{name: "a loop", links: map[string]string{"a": "b", "b": "a"}, err: "more than 40 symlinks"},
		{name: "onto a directory", files: map[string]string{"d/x": "x"}, links: map[string]string{"d": "x"}, err: "a directory already exists"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewMemFS(Limits{})
			for p, data := range tt.files {
				if err := b.Add(p, []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var s Symlinks
			for p, target := range tt.links {
				if err := s.Add(p, target); err != nil {
					t.Fatal(err)
				}
			}
			err := s.CopyInto(context.Background(), b)
			if tt.err != "" {
				if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("CopyInto = %v, want ErrRefused containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for p, want := range tt.want {
				if got, err := fs.ReadFile(b.FS(), p); err != nil || string(got) != want {
					t.Errorf("%s = %q, %v; want %q", p, got, err, want)
				}
			}
			if b.Len() != len(tt.files)+len(tt.want) {
				t.Errorf("artifact holds %d files, want %d", b.Len(), len(tt.files)+len(tt.want))
			}
		})
	}
}

func TestSymlinksAddRefuses(t *testing.T) {
	var s Symlinks
	for name, target := range map[string]string{"../x": "a", "/abs": "a", "l": "/etc/passwd", "e": "", "n": "a\x00b", "long": strings.Repeat("a/", MaxSymlinkTarget)} {
		if err := s.Add(name, target); !errors.Is(err, ErrRefused) {
			t.Errorf("Add(%q, %q) = %v, want ErrRefused", name, target, err)
		}
	}
	if err := s.Add("ok", "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Add("./ok", "b"); !errors.Is(err, ErrRefused) {
		t.Errorf("a second link at the same path = %v, want ErrRefused", err)
	}
}
