package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// User is the user and group the images run as: distroless's "nonroot".
const User = "65532:65532"

// BinDir is the directory the binary goes to; the entrypoint is
// BinDir/Options.Binary.
const BinDir = "/usr/local/bin"

// DefaultCABundle is the CA certificates file copied into the image: this
// machine's Debian bundle, at the path Go's crypto/x509 reads first on
// Linux, so Capstan's https to git servers and registries works in the
// image without SSL_CERT_FILE.
const DefaultCABundle = "/etc/ssl/certs/ca-certificates.crt"

// Options say what to build.
type Options struct {
	// Dir is the directory `go build` runs in: the module root.
	Dir string
	// Package is the Go package to build, e.g. "./cmd/capstan".
	Package string
	// Binary is the file name in BinDir and the entrypoint.
	Binary string
	// Args is the default command (the image's Cmd); may be empty.
	Args []string
	// Platforms are "os/arch[/variant]" (see Platform), e.g.
	// "linux/amd64", "linux/arm64"; the index lists them in this order.
	Platforms []string
	// LDFlags are passed to go build, e.g. "-X main.version=v0.1.0".
	LDFlags string
	// Labels become the image config's labels (org.opencontainers.image.*).
	// LabelCreated is added from Created unless set here.
	Labels map[string]string
	// Created is the image's creation time and every file's mtime, at
	// second precision, so that the same inputs give the same digest. Zero
	// means the Unix epoch; `make image` uses the commit's time.
	Created time.Time
	// CABundle is the CA certificates file to copy in; empty means
	// DefaultCABundle.
	CABundle string
	// Go is the go command; empty means "go" from PATH.
	Go string
	// Progress receives one line per step; nil discards them.
	Progress io.Writer
}

// Build cross-compiles opts.Package for every platform, in order, and
// returns the OCI index of the platforms' one-layer images. The binaries
// are static (CGO_ENABLED=0) and built with -trimpath, so the same source
// and options give the same digest on any machine with the same Go.
func Build(ctx context.Context, opts Options) (v1.ImageIndex, error) {
	platforms, err := opts.validate()
	if err != nil {
		return nil, fmt.Errorf("build image of %s: %w", opts.Package, err)
	}
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	bundle := opts.CABundle
	if bundle == "" {
		bundle = DefaultCABundle
	}
	certs, err := os.ReadFile(bundle)
	if err != nil {
		return nil, fmt.Errorf("build image of %s: read CA certificates (Debian: apt-get install ca-certificates): %w", opts.Package, err)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("build image of %s: CA certificates %s are empty", opts.Package, bundle)
	}
	tmp, err := os.MkdirTemp("", "capstan-image-")
	if err != nil {
		return nil, fmt.Errorf("build image of %s: %w", opts.Package, err)
	}
	defer os.RemoveAll(tmp)

	created := opts.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	created = created.UTC().Truncate(time.Second)
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range platforms {
		name := platformString(p)
		begin := time.Now()
		fmt.Fprintf(progress, "image: building %s for %s\n", opts.Package, name)
		bin := filepath.Join(tmp, p.OS+"-"+p.Architecture+p.Variant, opts.Binary)
		if err := goBuild(ctx, opts, p, bin); err != nil {
			return nil, err
		}
		img, layer, err := platformImage(opts, p, created, bin, certs)
		if err != nil {
			return nil, fmt.Errorf("build image of %s for %s: %w", opts.Package, name, err)
		}
		fmt.Fprintf(progress, "image: packed %s: layer %s (%s unpacked) in %s\n",
			name, MiB(layer.compressed), MiB(layer.uncompressed), time.Since(begin).Round(100*time.Millisecond))
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &p},
		})
	}
	return idx, nil
}

// validate reports every problem with opts together and returns the parsed
// platforms.
func (opts Options) validate() ([]v1.Platform, error) {
	var errs []error
	if opts.Package == "" {
		errs = append(errs, errors.New("empty Package: want a Go package such as ./cmd/capstan"))
	}
	if opts.Binary == "" || strings.ContainsAny(opts.Binary, `/\`) || opts.Binary == "." || opts.Binary == ".." {
		errs = append(errs, fmt.Errorf("binary %q: want a file name", opts.Binary))
	}
	if len(opts.Platforms) == 0 {
		errs = append(errs, errors.New("empty Platforms: want os/arch such as linux/amd64"))
	}
	var platforms []v1.Platform
	seen := map[string]bool{}
	for _, s := range opts.Platforms {
		p, err := Platform(s)
		switch {
		case err != nil:
			errs = append(errs, err)
		case p.OS != "linux":
			errs = append(errs, fmt.Errorf("platform %q: only linux images can be built", s))
		case seen[platformString(p)]:
			errs = append(errs, fmt.Errorf("platform %q: listed twice", s))
		default:
			seen[platformString(p)] = true
			platforms = append(platforms, p)
		}
	}
	return platforms, errors.Join(errs...)
}

// goBuild compiles a static binary of opts.Package for p into out.
func goBuild(ctx context.Context, opts Options, p v1.Platform, out string) error {
	args := []string{"build", "-trimpath", "-o", out}
	if opts.LDFlags != "" {
		args = append(args, "-ldflags", opts.LDFlags)
	}
	goCmd := opts.Go
	if goCmd == "" {
		goCmd = "go"
	}
	cmd := exec.CommandContext(ctx, goCmd, append(args, opts.Package)...)
	cmd.Dir = opts.Dir
	// Later entries win: the caller's CGO_ENABLED or GOARCH must not leak
	// into the image's binary.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture)
	if p.Architecture == "arm" && strings.HasPrefix(p.Variant, "v") {
		cmd.Env = append(cmd.Env, "GOARM="+strings.TrimPrefix(p.Variant, "v"))
	}
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s for %s: %w\n%s", opts.Package, platformString(p), err, bytes.TrimSpace(output.Bytes()))
	}
	return nil
}

// MiB formats a byte count for progress and summaries.
func MiB(n int64) string {
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
