package image

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/set-image")

func TestSetKustomizeImage(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name, file, ref string
		golden, wantErr string
	}{
		{name: "tag", file: "kustomization.yaml", ref: "ghcr.io/capstan-dev/capstan:v0.2.0", golden: "tag"},
		{name: "digest replaces the tag", file: "kustomization.yaml", ref: "127.0.0.1:5000/capstan@" + digest, golden: "digest"},
		{name: "tag and digest: the digest wins", file: "kustomization.yaml", ref: "127.0.0.1:5000/capstan:dev@" + digest, golden: "tag-and-digest"},
		{name: "docker hub name kept as written", file: "kustomization.yaml", ref: "capstan-dev/capstan:v1", golden: "docker-hub"},
		{name: "entry added, sequence style kept", file: "no-images.yaml", ref: "registry.example/capstan:v1", golden: "added"},
		{name: "other entries untouched", file: "other-images.yaml", ref: "ghcr.io/capstan-dev/capstan:v0.2.0", golden: "other-images"},
		{name: "a tag that reads as a number stays a string", file: "other-images.yaml", ref: "ghcr.io/capstan-dev/capstan:1.10", golden: "numeric-tag"},
		{name: "untagged reference refused", file: "kustomization.yaml", ref: "ghcr.io/capstan-dev/capstan", wantErr: "want REPO:TAG or REPO@sha256:"},
		{name: "bad reference refused", file: "kustomization.yaml", ref: "Capstan:v1", wantErr: "image reference"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, err := os.ReadFile(filepath.Join("testdata", "set-image", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "kustomization.yaml")
			if err := os.WriteFile(path, in, 0o644); err != nil {
				t.Fatal(err)
			}
			err = SetKustomizeImage(path, "capstan", tc.ref)
			got, readErr := os.ReadFile(path)
			if readErr != nil {
				t.Fatal(readErr)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				if string(got) != string(in) {
					t.Errorf("refused, yet the file changed:\n%s", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", "set-image", tc.golden+".golden.yaml")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("got:\n%s\nwant (%s):\n%s", got, golden, want)
			}
		})
	}
}
