package image

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// WriteOCITarball writes idx as an OCI image layout in a tar file at path,
// the format `ctr images import` and `skopeo copy oci-archive:` read. The
// layout's entry is annotated with ref twice: io.containerd.image.name,
// which containerd names the image by, and org.opencontainers.image.ref.name
// (the tag), which the OCI layout spec defines.
func WriteOCITarball(path string, idx v1.ImageIndex, ref string) error {
	r, err := name.ParseReference(ref)
	if err != nil {
		return fmt.Errorf("write image: reference %q: %w", ref, err)
	}
	dir, err := os.MkdirTemp("", "capstan-oci-layout-")
	if err != nil {
		return fmt.Errorf("write image: %w", err)
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("write image: %w", err)
	}
	err = lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          r.Name(),
		"org.opencontainers.image.ref.name": r.Identifier(),
	}))
	if err != nil {
		return fmt.Errorf("write image: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write image: %w", err)
	}
	tmp := path + ".tmp"
	if err := tarDir(dir, tmp); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write image: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write image: %w", err)
	}
	return nil
}

// tarDir writes the files under dir into a tar at path, sorted by name
// (fs.WalkDir's lexical order), without owners or times.
func tarDir(dir, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel := filepath.ToSlash(strings.TrimPrefix(p, dir+string(filepath.Separator)))
		if d.IsDir() {
			return tw.WriteHeader(&tar.Header{Name: rel + "/", Typeflag: tar.TypeDir, Mode: 0o755})
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: rel, Typeflag: tar.TypeReg, Mode: 0o644, Size: info.Size()}); err != nil {
			return err
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

// Push pushes idx to ref with the credentials of the Docker config
// (~/.docker/config.json, as `docker login` leaves them). A registry on
// localhost or 127.0.0.1 is reached over plain http, as go-containerregistry
// does for loopback.
func Push(ctx context.Context, idx v1.ImageIndex, ref string) (name.Digest, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return name.Digest{}, fmt.Errorf("push image: reference %q: %w", ref, err)
	}
	if err := remote.WriteIndex(r, idx, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return name.Digest{}, fmt.Errorf("push image %s: %w", ref, err)
	}
	d, err := idx.Digest()
	if err != nil {
		return name.Digest{}, fmt.Errorf("push image %s: %w", ref, err)
	}
	return r.Context().Digest(d.String()), nil
}
