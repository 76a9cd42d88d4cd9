package image

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// expectation is what every platform's image of one build must be.
type expectation struct {
	binary  string
	labels  map[string]string
	created time.Time
	// run is the argument list the binary is run with on this machine's
	// platform; output is a substring of what it must print.
	run    []string
	output string
}

// unpacked is one platform's image as read back: from an OCI tarball or a
// registry.
type unpacked struct {
	platform v1.Platform // the index entry's
	manifest *v1.Manifest
	config   *v1.ConfigFile
	files    map[string]file // by path, without the leading "/"
}

// file is one entry of the image's layers.
type file struct {
	hdr  *tar.Header
	data []byte
}

// imageChecks are the properties every image Build makes has, shared by
// the test image and Capstan's.
var imageChecks = []struct {
	name  string
	check func(t *testing.T, want expectation, img unpacked)
}{
	{"OCI media types for manifest, config and layer", func(t *testing.T, _ expectation, img unpacked) {
		if img.manifest.MediaType != types.OCIManifestSchema1 || img.manifest.Config.MediaType != types.OCIConfigJSON {
			t.Errorf("manifest %s with config %s, want OCI", img.manifest.MediaType, img.manifest.Config.MediaType)
		}
		if len(img.manifest.Layers) != 1 || img.manifest.Layers[0].MediaType != types.OCILayer {
			t.Errorf("layers %+v, want one %s", img.manifest.Layers, types.OCILayer)
		}
	}},
	{"config platform is the index entry's", func(t *testing.T, _ expectation, img unpacked) {
		got := v1.Platform{OS: img.config.OS, Architecture: img.config.Architecture, Variant: img.config.Variant}
		if !got.Equals(img.platform) {
			t.Errorf("config platform %v, index entry %v", got, img.platform)
		}
	}},
	{"runs as nonroot 65532:65532", func(t *testing.T, _ expectation, img unpacked) {
		if img.config.Config.User != "65532:65532" {
			t.Errorf("user %q, want 65532:65532", img.config.Config.User)
		}
	}},
	{"entrypoint is the binary in /usr/local/bin, no default args", func(t *testing.T, want expectation, img unpacked) {
		ep := img.config.Config.Entrypoint
		if len(ep) != 1 || ep[0] != "/usr/local/bin/"+want.binary || path.Base(ep[0]) != want.binary {
			t.Errorf("entrypoint %q, want [/usr/local/bin/%s]", ep, want.binary)
		}
		if len(img.config.Config.Cmd) != 0 {
			t.Errorf("cmd %q, want none", img.config.Config.Cmd)
		}
	}},
	{"env, working directory and creation time", func(t *testing.T, want expectation, img unpacked) {
		c := img.config.Config
		if strings.Join(c.Env, " ") != "PATH=/usr/local/bin:/usr/bin:/bin HOME=/home/nonroot" || c.WorkingDir != "/" {
			t.Errorf("env %q, workdir %q", c.Env, c.WorkingDir)
		}
		if !img.config.Created.Time.Equal(want.created) {
			t.Errorf("created %s, want %s", img.config.Created.Time, want.created)
		}
	}},
	{"labels, with created from the creation time", func(t *testing.T, want expectation, img unpacked) {
		for k, v := range want.labels {
			if got := img.config.Config.Labels[k]; got != v {
				t.Errorf("label %s = %q, want %q", k, got, v)
			}
		}
		if got := img.config.Config.Labels[LabelCreated]; got != want.created.UTC().Format(time.RFC3339) {
			t.Errorf("label %s = %q, want %s", LabelCreated, got, want.created.UTC().Format(time.RFC3339))
		}
	}},
	{"binary is a root-owned executable static ELF for the platform", func(t *testing.T, want expectation, img unpacked) {
		f, ok := img.files["usr/local/bin/"+want.binary]
		if !ok {
			t.Fatalf("no /usr/local/bin/%s in %v", want.binary, names(img.files))
		}
		if f.hdr.Mode != 0o755 || f.hdr.Uid != 0 || f.hdr.Gid != 0 {
			t.Errorf("mode %o owner %d:%d, want 755 0:0", f.hdr.Mode, f.hdr.Uid, f.hdr.Gid)
		}
		bin, err := elf.NewFile(bytes.NewReader(f.data))
		if err != nil {
			t.Fatal(err)
		}
		machine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[img.platform.Architecture]
		if bin.Machine != machine || bin.Type != elf.ET_EXEC {
			t.Errorf("ELF %s %s, want %s executable", bin.Type, bin.Machine, machine)
		}
		for _, p := range bin.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("program header %s: dynamically linked", p.Type)
			}
		}
	}},
	{"passwd and group name nonroot 65532 and its home", func(t *testing.T, _ expectation, img unpacked) {
		for name, line := range map[string]string{
			"etc/passwd": "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
			"etc/group":  "nonroot:x:65532:\n",
		} {
			if !strings.Contains(string(img.files[name].data), line) {
				t.Errorf("/%s is %q, want a line %q", name, img.files[name].data, line)
			}
		}
	}},
	{"CA certificates are this machine's", func(t *testing.T, _ expectation, img unpacked) {
		want, err := os.ReadFile(DefaultCABundle)
		if err != nil {
			t.Fatal(err)
		}
		got := img.files["etc/ssl/certs/ca-certificates.crt"]
		if got.hdr == nil || !bytes.Equal(got.data, want) || !bytes.Contains(got.data, []byte("BEGIN CERTIFICATE")) {
			t.Errorf("/etc/ssl/certs/ca-certificates.crt: %d bytes, want this machine's %d", len(got.data), len(want))
		}
	}},
	{"/tmp is 1777, /home/nonroot belongs to 65532", func(t *testing.T, _ expectation, img unpacked) {
		for name, want := range map[string]tar.Header{
			"tmp/":          {Typeflag: tar.TypeDir, Mode: 0o1777},
			"home/nonroot/": {Typeflag: tar.TypeDir, Mode: 0o700, Uid: 65532, Gid: 65532},
		} {
			h := img.files[name].hdr
			if h == nil || h.Typeflag != want.Typeflag || h.Mode != want.Mode || h.Uid != want.Uid || h.Gid != want.Gid {
				t.Errorf("/%s: %+v, want dir mode %o owner %d", name, h, want.Mode, want.Uid)
			}
		}
	}},
	{"every entry has the creation time as mtime", func(t *testing.T, want expectation, img unpacked) {
		for name, f := range img.files {
			if !f.hdr.ModTime.Equal(want.created) {
				t.Errorf("/%s mtime %s, want %s", name, f.hdr.ModTime, want.created)
			}
		}
	}},
	{"binary runs here and prints its stamped version", func(t *testing.T, want expectation, img unpacked) {
		if img.platform.Architecture != runtime.GOARCH || runtime.GOOS != "linux" {
			t.Skipf("a %s binary does not run on %s/%s", img.platform.Architecture, runtime.GOOS, runtime.GOARCH)
		}
		bin := filepath.Join(t.TempDir(), want.binary)
		if err := os.WriteFile(bin, img.files["usr/local/bin/"+want.binary].data, 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, want.run...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), want.output) {
			t.Errorf("%s %q: %v\n%s\nwant %q in the output", want.binary, want.run, err, out, want.output)
		}
	}},
}

// checkImages runs imageChecks on every image, and checks the images are
// for platforms, in that order.
func checkImages(t *testing.T, want expectation, platforms []string, imgs []unpacked) {
	t.Helper()
	var got []string
	for _, img := range imgs {
		got = append(got, platformString(img.platform))
	}
	if strings.Join(got, ",") != strings.Join(platforms, ",") {
		t.Fatalf("index platforms %q, want %q", got, platforms)
	}
	for _, img := range imgs {
		for _, c := range imageChecks {
			t.Run(platformString(img.platform)+"/"+c.name, func(t *testing.T) { c.check(t, want, img) })
		}
	}
}

// readOCITarball unpacks the OCI layout tarball at path and returns its
// index.json entry's descriptor and index.
func readOCITarball(t *testing.T, path string) (v1.Descriptor, v1.ImageIndex) {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !filepath.IsLocal(h.Name) {
			t.Fatalf("tar entry %q leaves the layout", h.Name)
		}
		dst := filepath.Join(dir, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(dst, 0o755)
		case tar.TypeReg:
			var data []byte
			if data, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(dst, data, 0o644)
			}
		default:
			t.Fatalf("tar entry %q of type %c", h.Name, h.Typeflag)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	root, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := root.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index.json has %d entries, want 1", len(im.Manifests))
	}
	idx, err := root.ImageIndex(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return im.Manifests[0], idx
}

// unpackIndex reads every image of idx and its layers' files.
func unpackIndex(t *testing.T, idx v1.ImageIndex) []unpacked {
	t.Helper()
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != types.OCIImageIndex {
		t.Errorf("index media type %s, want %s", im.MediaType, types.OCIImageIndex)
	}
	var out []unpacked
	for _, desc := range im.Manifests {
		if desc.Platform == nil {
			t.Fatalf("index entry %s has no platform", desc.Digest)
		}
		img, err := idx.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		u := unpacked{platform: *desc.Platform, files: map[string]file{}}
		if u.manifest, err = img.Manifest(); err != nil {
			t.Fatal(err)
		}
		if u.config, err = img.ConfigFile(); err != nil {
			t.Fatal(err)
		}
		layers, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range layers {
			rc, err := l.Uncompressed()
			if err != nil {
				t.Fatal(err)
			}
			tr := tar.NewReader(rc)
			for {
				h, err := tr.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				data, err := io.ReadAll(tr)
				if err != nil {
					t.Fatal(err)
				}
				u.files[h.Name] = file{hdr: h, data: data}
			}
			rc.Close()
		}
		out = append(out, u)
	}
	return out
}

// names lists the files' paths, for failure messages.
func names(files map[string]file) []string {
	var out []string
	for n := range files {
		out = append(out, n)
	}
	return out
}
