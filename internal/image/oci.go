package image

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// Annotations on the OCI layout's index.json entry that name the image.
const (
	// AnnotationContainerdName is the full reference containerd's importer
	// (`ctr images import`) names the image by.
	AnnotationContainerdName = "io.containerd.image.name"
	// AnnotationRefName is the OCI layout's name for the entry: the tag
	// (or digest); `ctr images import --base-name REPO` joins it to REPO.
	AnnotationRefName = "org.opencontainers.image.ref.name"
)

// WriteOCITarball writes idx as an OCI image layout (oci-layout,
// index.json, blobs/sha256/...) in a tar file at path, the format
// `ctr -n k8s.io images import --all-platforms` and
// `skopeo copy oci-archive:` read. index.json has one entry, idx, annotated
// with ref under AnnotationContainerdName and its tag or digest under
// AnnotationRefName. ref must be complete, REGISTRY/REPO:TAG, as the name
// containerd keeps is the one a pod's image field must match. The file is
// replaced whole, never left half written.
func WriteOCITarball(path string, idx v1.ImageIndex, ref string) error {
	r, err := name.ParseReference(ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("write image %s: %w", path, err)
	}
	dir, err := os.MkdirTemp("", "capstan-oci-layout-")
	if err != nil {
		return fmt.Errorf("write image %s: %w", path, err)
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("write image %s: OCI layout: %w", path, err)
	}
	err = lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		AnnotationContainerdName: r.Name(),
		AnnotationRefName:        r.Identifier(),
	}))
	if err != nil {
		return fmt.Errorf("write image %s: OCI layout: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write image %s: %w", path, err)
	}
	tmp := path + ".tmp"
	if err := tarDir(dir, tmp); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write image %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write image %s: %w", path, err)
	}
	return nil
}

// tarDir writes the files under dir into a tar at path in fs.WalkDir's
// lexical order, without owners or times, so the tar depends only on the
// files' names and contents.
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
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
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
