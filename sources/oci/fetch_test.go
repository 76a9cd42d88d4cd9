package oci

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/capstan-dev/capstan/sources"
)

// writeImage pushes an image made of layers (tar or tar+gzip bytes with
// their media types) to repo:tag on reg, the way other tools would.
func writeImage(t *testing.T, reg *testRegistry, repo, tag string, layers ...v1.Layer) {
	t.Helper()
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	for _, l := range layers {
		var err error
		if img, err = mutate.Append(img, mutate.Addendum{Layer: l}); err != nil {
			t.Fatal(err)
		}
	}
	ref, err := name.NewTag(reg.Host + "/" + repo + ":" + tag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
}

func TestFetchPlainSingleLayerImage(t *testing.T) {
	ctx := testContext(t)
	reg := newTestRegistry(t, "", "")
	for _, tt := range []struct {
		mediaType types.MediaType
		gz        bool
	}{{types.OCILayer, true}, {types.DockerLayer, true}, {types.OCIUncompressedLayer, false}} {
		t.Run(string(tt.mediaType), func(t *testing.T) {
			layer := static.NewLayer(tarball(t, tt.gz, file("clusters/east/cm.yaml", "kind: ConfigMap\n")), tt.mediaType)
			writeImage(t, reg, "plain", "v1", layer)
			art, err := newSource(t, Options{URL: reg.URL("plain"), Ref: Ref{Tag: "v1"}}).Fetch(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if art.Size != int64(len("kind: ConfigMap\n")) {
				t.Errorf("artifact size = %d", art.Size)
			}
		})
	}
}

func TestFetchRefuses(t *testing.T) {
	ctx := testContext(t)
	reg := newTestRegistry(t, "", "")
	good := static.NewLayer(tarball(t, true, file("a.yaml", "a")), FluxContentMediaType)

	writeImage(t, reg, "two-layers", "v1", good, static.NewLayer(tarball(t, true, file("b.yaml", "b")), types.OCILayer))
	writeImage(t, reg, "zstd", "v1", static.NewLayer([]byte("not really zstd"), types.OCILayerZStd))
	writeImage(t, reg, "escape", "v1", static.NewLayer(tarball(t, true, file("ok.yaml", "ok"), symlink("x", "../../etc/passwd")), FluxContentMediaType))
	writeImage(t, reg, "big", "v1", static.NewLayer(tarball(t, true, file("a.yaml", randomText(64<<10))), FluxContentMediaType))

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img, _ = mutate.Append(img, mutate.Addendum{Layer: good})
	index := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), mutate.IndexAddendum{Add: img})
	ref, _ := name.NewTag(reg.Host + "/index:v1")
	if err := remote.WriteIndex(ref, index); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		repo    string
		maxDown int64
		want    string
		noBlob  bool
	}{
		{name: "two layers", repo: "two-layers", want: "has 2 layers", noBlob: true},
		{name: "an unsupported layer type", repo: "zstd", want: "not a tar or tar+gzip layer", noBlob: true},
		{name: "an image index", repo: "index", want: "image index", noBlob: true},
		{name: "a symlink out of the artifact", repo: "escape", want: "symlink x: content refused: points outside the artifact root"},
		{name: "a layer over the download limit", repo: "big", maxDown: 1 << 10, want: "over the download limit of 1024 bytes", noBlob: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSource(t, Options{URL: reg.URL(tt.repo), Ref: Ref{Tag: "v1"}, MaxDownloadBytes: tt.maxDown})
			reg.take()
			_, err := s.Fetch(ctx)
			if !errors.Is(err, sources.ErrRefused) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Fetch = %v, want ErrRefused containing %q", err, tt.want)
			}
			if !strings.Contains(err.Error(), reg.Host+"/"+tt.repo) {
				t.Errorf("Fetch = %v, want it to name the repository", err)
			}
			if got := reg.take(); tt.noBlob && count(got, "GET blobs") != 0 {
				t.Errorf("Fetch made %v, want no blob download", got)
			}
		})
	}
}

// randomText returns n bytes that gzip cannot shrink much.
func randomText(n int) string {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('!' + r.IntN(90))
	}
	return string(b)
}
