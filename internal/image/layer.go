package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// nonrootUID is the uid and gid of User.
const nonrootUID = 65532

// passwd and group name root and nonroot as distroless does, so that
// tools which look the user up (git, ssh) find a name and a home.
const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group  = "root:x:0:\nnonroot:x:65532:\n"
)

// layerSize is a layer's size compressed (as pushed) and uncompressed (as
// unpacked on a node).
type layerSize struct {
	compressed, uncompressed int64
}

// platformImage packs the binary at bin into a one-layer image for p.
func platformImage(opts Options, p v1.Platform, created time.Time, bin string, certs []byte) (v1.Image, layerSize, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, layerSize{}, err
	}
	rootTar, err := rootfs(opts.Binary, data, certs, created)
	if err != nil {
		return nil, layerSize{}, err
	}
	gz, err := gzipBytes(rootTar)
	if err != nil {
		return nil, layerSize{}, err
	}
	// Compressed once here rather than by go-containerregistry on every
	// read (digest, layout write, push): the binary is tens of MiB.
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gz)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, layerSize{}, err
	}
	labels := map[string]string{LabelCreated: created.Format(time.RFC3339)}
	for k, v := range opts.Labels {
		labels[k] = v
	}
	entrypoint := path.Join(BinDir, opts.Binary)
	cfg := &v1.ConfigFile{
		Architecture: p.Architecture,
		OS:           p.OS,
		Variant:      p.Variant,
		Created:      v1.Time{Time: created},
		Config: v1.Config{
			User:       User,
			Entrypoint: []string{entrypoint},
			Cmd:        opts.Args,
			Env:        []string{"PATH=" + BinDir + ":/usr/bin:/bin", "HOME=/home/nonroot"},
			WorkingDir: "/",
			Labels:     labels,
		},
		RootFS: v1.RootFS{Type: "layers"},
	}
	img, err := mutate.ConfigFile(empty.Image, cfg)
	if err != nil {
		return nil, layerSize{}, err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: created},
			CreatedBy: "capstan image: go build -trimpath " + opts.Package,
			Comment:   "static " + opts.Binary + ", CA certificates, passwd with nonroot",
		},
	})
	if err != nil {
		return nil, layerSize{}, err
	}
	return img, layerSize{compressed: int64(len(gz)), uncompressed: int64(len(rootTar))}, nil
}

// rootfs returns the layer's tar: the binary, passwd and group with root
// and nonroot, the CA certificates, /tmp and nonroot's home. Entries are
// sorted, root-owned unless nonroot's, and carry mtime, so the same inputs
// give the same bytes.
func rootfs(binary string, bin, certs []byte, mtime time.Time) ([]byte, error) {
	type entry struct {
		mode int64
		uid  int
		data []byte
		dir  bool
	}
	entries := map[string]entry{
		"etc/":                                   {mode: 0o755, dir: true},
		"etc/group":                              {mode: 0o644, data: []byte(group)},
		"etc/passwd":                             {mode: 0o644, data: []byte(passwd)},
		"etc/ssl/":                               {mode: 0o755, dir: true},
		"etc/ssl/certs/":                         {mode: 0o755, dir: true},
		strings.TrimPrefix(DefaultCABundle, "/"): {mode: 0o644, data: certs},
		"home/":                                  {mode: 0o755, dir: true},
		"home/nonroot/":                          {mode: 0o700, uid: nonrootUID, dir: true},
		"root/":                                  {mode: 0o700, dir: true},
		"tmp/":                                   {mode: 0o1777, dir: true},
		"usr/":                                   {mode: 0o755, dir: true},
		"usr/local/":                             {mode: 0o755, dir: true},
		strings.TrimPrefix(BinDir, "/") + "/":    {mode: 0o755, dir: true},
		path.Join(BinDir[1:], binary):            {mode: 0o755, data: bin},
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	// "/" sorts before letters, so every directory precedes its contents.
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		h := &tar.Header{Name: n, Mode: e.mode, Uid: e.uid, Gid: e.uid, ModTime: mtime, Format: tar.FormatPAX}
		if e.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// gzipBytes compresses b with the standard library's gzip, whose output
// depends only on its input and level (no name, no mtime in the header).
// The default level: the best one saves under 1% of Capstan's layer for
// three times the time.
func gzipBytes(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(b); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
