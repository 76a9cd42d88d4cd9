package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/capstan-dev/capstan/sources"
)

// The media types of the artifact format `flux push artifact` produces,
// which `capstan push artifact` produces too.
const (
	// FluxConfigMediaType is the config media type of a Flux artifact.
	FluxConfigMediaType types.MediaType = "application/vnd.cncf.flux.config.v1+json"
	// FluxContentMediaType is the media type of a Flux artifact's one layer:
	// a gzip-compressed tar of the directory.
	FluxContentMediaType types.MediaType = "application/vnd.cncf.flux.content.v1.tar+gzip"
)

// layerMediaTypes are the layer media types Fetch unpacks: Flux's, and a
// plain single-layer image's.
var layerMediaTypes = map[types.MediaType]bool{
	FluxContentMediaType:       true,
	types.OCILayer:             true,
	types.DockerLayer:          true,
	types.OCIUncompressedLayer: true,
}

// Fetch implements sources.Source: it resolves the ref (listing tags for a
// semver range), downloads the manifest, checks the artifact's cosign
// signature when Options.Verify asks for it, then downloads its one layer
// and unpacks it into an Artifact within the limits. The artifact's revision is the
// manifest actually downloaded, which may be newer than what Revision
// answered a moment before.
func (s *Source) Fetch(ctx context.Context) (*sources.Artifact, error) {
	tag, ref, err := s.resolveTag(ctx)
	if err != nil {
		return nil, err
	}
	desc, err := s.puller.Get(ctx, ref)
	if err != nil {
		return nil, s.classify("fetch manifest of", ref, err)
	}
	digestRef := s.repo.Digest(desc.Digest.String())
	layer, err := s.checkManifest(digestRef, desc.MediaType, desc.Manifest)
	if err != nil {
		return nil, err
	}
	if s.verifyKeys != nil {
		if err := s.verifySignature(ctx, desc.Digest); err != nil {
			return nil, err
		}
	}
	b, err := s.download(ctx, layer)
	if err != nil {
		return nil, err
	}
	return b.Artifact(revision(tag, desc.Digest)), nil
}

// checkManifest returns the one layer of an artifact's manifest, or the
// reason the manifest is not an artifact Capstan reads.
func (s *Source) checkManifest(ref name.Digest, mediaType types.MediaType, raw []byte) (v1.Descriptor, error) {
	refuse := func(hint string) (v1.Descriptor, error) {
		return v1.Descriptor{}, s.newError("fetch", ref, sources.ErrRefused, hint, nil)
	}
	if len(raw) > maxManifestBytes {
		return refuse(fmt.Sprintf("the manifest is %d bytes, over the limit of %d", len(raw), maxManifestBytes))
	}
	if mediaType.IsIndex() {
		return refuse("this is an image index (a multi-platform image), not an artifact: push the directory with `capstan push artifact` or `flux push artifact`")
	}
	if mediaType != types.OCIManifestSchema1 && mediaType != types.DockerManifestSchema2 {
		return refuse(fmt.Sprintf("manifest media type %q is not an OCI or Docker image manifest", mediaType))
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return refuse("the manifest does not parse: " + err.Error())
	}
	if len(m.Layers) != 1 {
		return refuse(fmt.Sprintf("the artifact has %d layers; Capstan reads artifacts of exactly one layer, as `capstan push artifact` and `flux push artifact` produce", len(m.Layers)))
	}
	layer := m.Layers[0]
	if !layerMediaTypes[layer.MediaType] {
		return refuse(fmt.Sprintf("layer media type %q is not a tar or tar+gzip layer (expected %s or %s)",
			layer.MediaType, FluxContentMediaType, types.OCILayer))
	}
	if layer.Size > s.maxDown {
		return refuse(fmt.Sprintf("the layer is %d bytes, over the download limit of %d bytes", layer.Size, s.maxDown))
	}
	return layer, nil
}

// download streams the layer through the unpacker, counting the bytes, and
// checks the layer's digest once it has been read to its end. The files go
// to a directory of Options.CacheDir when it is set, else into memory;
// neither the layer nor its tar stream is ever held whole.
func (s *Source) download(ctx context.Context, layer v1.Descriptor) (_ *sources.Builder, err error) {
	blobRef := s.repo.Digest(layer.Digest.String())
	l, err := s.puller.Layer(ctx, blobRef)
	if err != nil {
		return nil, s.classify("fetch layer", blobRef, err)
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, s.classify("fetch layer", blobRef, err)
	}
	defer rc.Close()
	b, err := s.newBuilder()
	if err != nil {
		return nil, s.newError("unpack layer", blobRef, nil, "create the artifact directory", err)
	}
	defer func() {
		if err != nil {
			b.Discard()
		}
	}()
	lr := &limitReader{r: rc, n: s.maxDown}
	err = UnpackInto(ctx, lr, b, s.limits)
	if err == nil {
		// The digest is verified when the stream reaches its end, which
		// the tar reader does not need to read.
		_, err = io.Copy(io.Discard, lr)
	}
	switch {
	case lr.exceeded:
		return nil, s.newError("fetch layer", blobRef, sources.ErrRefused,
			fmt.Sprintf("the layer is over the download limit of %d bytes (--max-artifact-bytes=%s)", s.maxDown, sources.FormatBytes(s.maxDown)), nil)
	case err == nil:
		return b, nil
	case errors.Is(err, sources.ErrRefused):
		return nil, s.newError("unpack layer", blobRef, nil, "", err)
	default:
		return nil, s.classify("fetch layer", blobRef, err)
	}
}

// newBuilder returns the builder of an artifact: on disk when the options
// name a cache directory.
func (s *Source) newBuilder() (*sources.Builder, error) {
	if s.opts.CacheDir == "" {
		return sources.NewMemFS(s.limits.Files), nil
	}
	dir, err := os.MkdirTemp(s.opts.CacheDir, "artifact-")
	if err != nil {
		return nil, err
	}
	b, err := sources.NewDiskFS(dir, s.limits.Files)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return b, nil
}
