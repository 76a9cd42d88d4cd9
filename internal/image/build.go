package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// User is the user and group the images run as: distroless's "nonroot".
const User = "65532:65532"

// binDir is where the binary goes in the image.
const binDir = "/usr/local/bin"

// caBundle is the CA certificates file copied into the image from this
// machine, at the path Go's crypto/x509 reads first on Linux.
const caBundle = "/etc/ssl/certs/ca-certificates.crt"

// Options say what to build.
type Options struct {
	// Dir is the directory `go build` runs in: the module root.
	Dir string
	// Package is the Go package to build, e.g. "./cmd/capstan".
	Package string
	// Binary is the file name in /usr/local/bin and the entrypoint.
	Binary string
	// Args is the default command (the image's Cmd).
	Args []string
	// Platforms are "os/arch[/variant]", e.g. "linux/amd64", "linux/arm64".
	Platforms []string
	// LDFlags are passed to go build.
	LDFlags string
	// Labels become the image config's labels (org.opencontainers.image.*).
	Labels map[string]string
	// Created is the image's creation time and every file's mtime, so that
	// the same inputs give the same digest. Zero means the Unix epoch.
	Created time.Time
	// CABundle is the CA certificates file to copy in; empty means this
	// machine's /etc/ssl/certs/ca-certificates.crt.
	CABundle string
	// Progress receives one line per step; nil discards them.
	Progress io.Writer
}

// Build cross-compiles opts.Package for every platform and returns the
// index of the platforms' images, in the order given.
func Build(ctx context.Context, opts Options) (v1.ImageIndex, error) {
	if opts.Package == "" || opts.Binary == "" || len(opts.Platforms) == 0 {
		return nil, errors.New("build image: Package, Binary and Platforms are required")
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	if opts.CABundle == "" {
		opts.CABundle = caBundle
	}
	certs, err := os.ReadFile(opts.CABundle)
	if err != nil {
		return nil, fmt.Errorf("build image: CA certificates: %w (install Debian's ca-certificates)", err)
	}
	tmp, err := os.MkdirTemp("", "capstan-image-")
	if err != nil {
		return nil, fmt.Errorf("build image: %w", err)
	}
	defer os.RemoveAll(tmp)

	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range opts.Platforms {
		platform, err := Platform(p)
		if err != nil {
			return nil, fmt.Errorf("build image: %w", err)
		}
		begin := time.Now()
		bin := filepath.Join(tmp, platform.OS+"-"+platform.Architecture+"-"+opts.Binary)
		if err := goBuild(ctx, opts, platform, bin); err != nil {
			return nil, err
		}
		img, err := imageFor(opts, platform, bin, certs)
		if err != nil {
			return nil, fmt.Errorf("build image for %s: %w", p, err)
		}
		fmt.Fprintf(opts.Progress, "image: built %s for %s in %s\n", opts.Binary, p, time.Since(begin).Round(100*time.Millisecond))
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &platform},
		})
	}
	return idx, nil
}

// Platform parses "os/arch[/variant]". linux/arm64 gets variant v8, as
// registries and containerd expect.
func Platform(s string) (v1.Platform, error) {
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return v1.Platform{}, fmt.Errorf("platform %q: want os/arch[/variant], e.g. linux/amd64", s)
	}
	p := v1.Platform{OS: parts[0], Architecture: parts[1]}
	if len(parts) == 3 {
		p.Variant = parts[2]
	} else if p.Architecture == "arm64" {
		p.Variant = "v8"
	}
	return p, nil
}

// goBuild compiles a static binary for platform into out.
func goBuild(ctx context.Context, opts Options, platform v1.Platform, out string) error {
	args := []string{"build", "-trimpath", "-o", out}
	if opts.LDFlags != "" {
		args = append(args, "-ldflags", opts.LDFlags)
	}
	cmd := exec.CommandContext(ctx, "go", append(args, opts.Package)...)
	cmd.Dir = opts.Dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+platform.OS, "GOARCH="+platform.Architecture)
	if platform.Architecture == "arm" && strings.HasPrefix(platform.Variant, "v") {
		cmd.Env = append(cmd.Env, "GOARM="+strings.TrimPrefix(platform.Variant, "v"))
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s for %s/%s: %w\n%s", opts.Package, platform.OS, platform.Architecture, err, stderr.String())
	}
	return nil
}

// imageFor packs bin into a one-layer image for platform.
func imageFor(opts Options, platform v1.Platform, bin string, certs []byte) (v1.Image, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	layerTar, err := rootfs(opts, data, certs)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	created := v1.Time{Time: opts.Created.UTC()}
	cfg := &v1.ConfigFile{
		Architecture: platform.Architecture,
		OS:           platform.OS,
		Variant:      platform.Variant,
		Created:      created,
		Config: v1.Config{
			User:       User,
			Entrypoint: []string{binDir + "/" + opts.Binary},
			Cmd:        opts.Args,
			Env:        []string{"PATH=" + binDir + ":/usr/bin:/bin", "HOME=/home/nonroot"},
			WorkingDir: "/",
			Labels:     opts.Labels,
		},
		RootFS: v1.RootFS{Type: "layers"},
	}
	img, err := mutate.ConfigFile(empty.Image, cfg)
	if err != nil {
		return nil, err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	return mutate.Append(img, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: created, CreatedBy: "capstan image: " + opts.Package, Comment: "static binary, CA certificates, nonroot user"},
	})
}

// rootfs returns the layer's tar: the binary, passwd and group with root
// and nonroot, CA certificates, /tmp and nonroot's home. Entries are sorted
// and carry opts.Created, so the tar is the same for the same inputs.
func rootfs(opts Options, bin, certs []byte) ([]byte, error) {
	type entry struct {
		mode int64
		uid  int
		data []byte
		dir  bool
	}
	files := map[string]entry{
		"etc/":                            {mode: 0o755, dir: true},
		"etc/ssl/":                        {mode: 0o755, dir: true},
		"etc/ssl/certs/":                  {mode: 0o755, dir: true},
		strings.TrimPrefix(caBundle, "/"): {mode: 0o644, data: certs},
		"etc/passwd":                      {mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		"etc/group":                       {mode: 0o644, data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		"home/":                           {mode: 0o755, dir: true},
		"home/nonroot/":                   {mode: 0o700, uid: 65532, dir: true},
		"root/":                           {mode: 0o700, dir: true},
		"tmp/":                            {mode: 0o1777, dir: true},
		"usr/":                            {mode: 0o755, dir: true},
		"usr/local/":                      {mode: 0o755, dir: true},
		"usr/local/bin/":                  {mode: 0o755, dir: true},
		"usr/local/bin/" + opts.Binary:    {mode: 0o755, data: bin},
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := opts.Created.UTC()
	for _, n := range names {
		e := files[n]
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
