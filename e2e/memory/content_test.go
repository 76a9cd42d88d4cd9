package memory

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/sources/oci"
)

// pushContent pushes each deployment's content and fills in its source.
func pushContent(t *testing.T, ns string, deployments []*hostile) {
	t.Helper()
	app := map[string]string{
		"clusters/app/kustomization.yaml": "resources: [cm.yaml]\n",
		"clusters/app/cm.yaml":            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app, namespace: " + ns + "}\ndata: {a: b}\n",
	}
	for _, h := range deployments {
		var layer []byte
		switch h.name {
		case "bomb-pax":
			layer = paxBomb(t, tar.TypeDir)
		case "bomb-pax-global":
			layer = paxBomb(t, tar.TypeXGlobalHeader)
		case "bomb-zeros":
			layer = zeroFilesBomb(t, 4<<20)
		case "bomb-one-file":
			layer = oneFileBomb(t)
		case "big-yaml":
			files := map[string]string{
				"clusters/big/kustomization.yaml": "resources: [big.yaml]\n",
				"clusters/big/big.yaml":           bigYAML(ns, 50<<20, "big"),
			}
			h.source = gitRepo(t, h.name, files)
			continue
		case "render-at-limit-a", "render-at-limit-b", "render-at-limit-c":
			layer = fullOverlay(t, ns, h.name)
		case "unrelated-files":
			files := map[string]string{}
			for k, v := range app {
				files[k] = v
			}
			// 70 MB in 35 files under the per-file limit, that gzip and
			// git cannot shrink: a repository's other content.
			for i := range 35 {
				files[fmt.Sprintf("assets/blob-%02d.bin", i)] = randomText(2<<20, uint64(i))
			}
			h.source = gitRepo(t, h.name, files)
			continue
		}
		ref := registryHost + "/" + ns + "/" + h.name
		tag, err := name.NewTag(ref + ":v1")
		if err != nil {
			t.Fatal(err)
		}
		img, err := mutate.Append(mutate.MediaType(empty.Image, types.OCIManifestSchema1),
			mutate.Addendum{Layer: static.NewLayer(layer, oci.FluxContentMediaType)})
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(tag, img); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: a %d MiB gzip layer", h.name, len(layer)>>20)
		h.source = &capstanv1.SourceSpec{OCI: &capstanv1.OCISource{URL: "oci://" + ref, Ref: capstanv1.OCIRef{Tag: "v1"}}}
	}
}

func gitRepo(t *testing.T, repo string, files map[string]string) *capstanv1.SourceSpec {
	t.Helper()
	if _, err := gitSrv.CreateRepo(repo); err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(repo, "main", files, "content"); err != nil {
		t.Fatal(err)
	}
	return &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: gitSrv.HTTPURL(repo)}}
}

// The gzip bombs: multistream gzip of members cheap to make and repeat,
// each layer bombBytes compressed and many GiB decompressed.
type gzipper struct {
	t  *testing.T
	zw *gzip.Writer
}

func (g *gzipper) member(data []byte) []byte {
	var buf bytes.Buffer
	if g.zw == nil {
		g.zw, _ = gzip.NewWriterLevel(&buf, gzip.BestCompression)
	} else {
		g.zw.Reset(&buf)
	}
	if _, err := g.zw.Write(data); err != nil {
		g.t.Fatal(err)
	}
	if err := g.zw.Close(); err != nil {
		g.t.Fatal(err)
	}
	return buf.Bytes()
}

func header(t *testing.T, hdr *tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(hdr); err != nil {
		t.Fatal(err)
	}
	tw.Flush()
	return buf.Bytes()
}

func repeatTo(member []byte, size int) []byte {
	out := make([]byte, 0, size+len(member))
	for len(out) < size {
		out = append(out, member...)
	}
	return out
}

// paxBomb repeats an entry whose PAX records hold a MiB each (on a
// directory, or as a global header): no file limit sees them, and a
// member of about a KiB inflates to a MiB.
func paxBomb(t *testing.T, typ byte) []byte {
	hdr := &tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755, Format: tar.FormatPAX,
		PAXRecords: map[string]string{"comment": strings.Repeat("x", 1<<20-64)}}
	if typ == tar.TypeXGlobalHeader {
		hdr = &tar.Header{Typeflag: tar.TypeXGlobalHeader, Format: tar.FormatPAX,
			PAXRecords: map[string]string{"comment": strings.Repeat("y", 1<<20-64)}}
	}
	g := &gzipper{t: t}
	return repeatTo(g.member(header(t, hdr)), bombBytes)
}

// zeroFilesBomb is files of fileSize zeros, each under the per-file limit,
// many more than an artifact may hold.
func zeroFilesBomb(t *testing.T, fileSize int64) []byte {
	g := &gzipper{t: t}
	zeros := g.member(make([]byte, fileSize))
	out := make([]byte, 0, bombBytes+len(zeros)+1024)
	for i := 0; len(out) < bombBytes; i++ {
		out = append(out, g.member(header(t, &tar.Header{Name: fmt.Sprintf("zeros/%06d", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: fileSize}))...)
		out = append(out, zeros...)
	}
	return out
}

// oneFileBomb is one file of a TiB of zeros.
func oneFileBomb(t *testing.T) []byte {
	g := &gzipper{t: t}
	head := g.member(header(t, &tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1 << 40}))
	return append(head, repeatTo(g.member(make([]byte, 4<<20)), bombBytes)...)
}

// fullOverlay is an artifact whose overlay reads just under the default
// --max-render-bytes (16 MiB) in two files under --max-file-bytes, one
// object of which names a stage that no plan has.
func fullOverlay(t *testing.T, ns, name string) []byte {
	const budget = 16 << 20
	half := (budget - 256<<10) / 2 // room for the kustomization, counted once per object
	files := []struct {
		name string
		data []byte
	}{
		{"clusters/full/kustomization.yaml", []byte("resources: [a.yaml, b.yaml, nowhere.yaml]\n")},
		{"clusters/full/nowhere.yaml", []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: nowhere, namespace: " + ns +
			", labels: {capstan.dev/stage: nowhere}}\n")},
		{"clusters/full/a.yaml", []byte(bigYAML(ns, half, name+"-a"))},
		{"clusters/full/b.yaml", []byte(bigYAML(ns, half, name+"-b"))},
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, f := range files {
		if len(f.data) > budget/2 {
			t.Fatalf("%s: %d bytes, over the per-file limit", f.name, len(f.data))
		}
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write(f.data)
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

// bigYAML is about size bytes of ConfigMaps in one file.
func bigYAML(ns string, size int, prefix string) string {
	var b strings.Builder
	line := strings.Repeat("v", 100)
	for i := 0; ; i++ {
		var doc strings.Builder
		fmt.Fprintf(&doc, "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: %s-%d, namespace: %s}\ndata:\n", prefix, i, ns)
		for j := range 50 {
			fmt.Fprintf(&doc, "  k%d: %s-%d\n", j, line, i)
		}
		if b.Len()+doc.Len() > size {
			return b.String()
		}
		b.WriteString(doc.String())
	}
}

func randomText(n int, seed uint64) string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[r.IntN(len(letters))]
	}
	return string(b)
}
