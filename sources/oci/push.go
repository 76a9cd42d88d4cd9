package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io/fs"
	"net/http"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/capstan-dev/capstan/sources"
)

// The annotations `flux push artifact` sets, which Push sets when given.
const (
	// AnnotationSource is the URL the content came from.
	AnnotationSource = "org.opencontainers.image.source"
	// AnnotationRevision is the revision (e.g. a commit) the content came
	// from.
	AnnotationRevision = "org.opencontainers.image.revision"
	// AnnotationCreated is when the artifact was made (RFC 3339).
	AnnotationCreated = "org.opencontainers.image.created"
)

// PushOptions says where and how Push uploads an artifact.
type PushOptions struct {
	// Tag to push; DefaultTag when empty.
	Tag string
	// Auth holds the registry credentials.
	Auth Auth
	// Insecure allows plain http to a registry that is not on loopback.
	Insecure bool
	// Annotations are added to the manifest, e.g. AnnotationSource and
	// AnnotationRevision. Push sets none by itself, so that the same
	// content pushed twice has the same digest and no deployment sees a
	// new revision for it.
	Annotations map[string]string
	// Transport is the HTTP transport; nil means a clone of
	// http.DefaultTransport that trusts Auth.CABundle.
	Transport http.RoundTripper
}

// Push packs every regular file of fsys into a gzip-compressed tar, in the
// artifact format of `flux push artifact` (config FluxConfigMediaType, one
// layer FluxContentMediaType), and uploads it to url (oci://host/path) at
// opts.Tag. It returns the revision a Source following that tag will
// report ("<tag>@sha256:<hex>"). The tar is reproducible: entries in
// lexical order, no owners, no modification times.
func Push(ctx context.Context, url string, fsys fs.FS, opts PushOptions) (string, error) {
	repo, display, err := ParseURL(url, opts.Insecure)
	if err != nil {
		return "", err
	}
	tagName := opts.Tag
	if tagName == "" {
		tagName = DefaultTag
	}
	tag, err := name.NewTag(repo.Name()+":"+tagName, name.StrictValidation)
	if err != nil {
		return "", fmt.Errorf("push %s: %w: %q is not a valid tag", display, sources.ErrInvalid, tagName)
	}
	if opts.Insecure {
		tag, _ = name.NewTag(repo.Name()+":"+tagName, name.StrictValidation, name.Insecure)
	}
	tgz, err := Pack(fsys)
	if err != nil {
		return "", fmt.Errorf("push %s: %w", display, err)
	}
	img, err := artifactImage(tgz, opts.Annotations)
	if err != nil {
		return "", fmt.Errorf("push %s: build the manifest: %w", display, err)
	}
	keychain, err := opts.Auth.keychain()
	if err != nil {
		return "", fmt.Errorf("push %s: %w", display, err)
	}
	rt, err := opts.Auth.transport(opts.Transport)
	if err != nil {
		return "", fmt.Errorf("push %s: %w", display, err)
	}
	ropts := append(remoteOptions(keychain, rt), remote.WithContext(ctx))
	if err := remote.Write(tag, img, ropts...); err != nil {
		return "", fmt.Errorf("push %s:%s: %w", display, tagName, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("push %s: %w", display, err)
	}
	return revision(tagName, digest), nil
}

// artifactImage wraps a tar+gzip layer in a Flux artifact manifest.
func artifactImage(tgz []byte, annotations map[string]string) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, FluxConfigMediaType)
	img, err := mutate.Append(img, mutate.Addendum{Layer: static.NewLayer(tgz, FluxContentMediaType)})
	if err != nil {
		return nil, err
	}
	if len(annotations) > 0 {
		img = mutate.Annotations(img, annotations).(v1.Image)
	}
	return img, nil
}

// Pack returns a reproducible gzip-compressed tar of the regular files of
// fsys and the directories that hold them. Anything else (a symlink, a
// device) is refused with an error wrapping sources.ErrRefused: build fsys
// with the dir source to have links inside it resolved into copies.
func Pack(fsys fs.FS) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	epoch := time.Unix(0, 0).UTC()
	err = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == "." {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: p, ModTime: epoch}
		switch {
		case info.IsDir():
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, p+"/", 0o755
			return tw.WriteHeader(hdr)
		case info.Mode().IsRegular():
			data, err := fs.ReadFile(fsys, p)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, int64(info.Mode().Perm()), int64(len(data))
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			_, err = tw.Write(data)
			return err
		default:
			return fmt.Errorf("pack %s: %w: file type %s; only regular files and directories are packed", p, sources.ErrRefused, info.Mode().Type())
		}
	})
	if err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
