package image

import (
	"fmt"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// PlatformImage is one platform's image of an index and what it weighs.
type PlatformImage struct {
	// Platform is the index entry's platform.
	Platform v1.Platform
	// Digest is the image manifest's digest.
	Digest v1.Hash
	// Compressed is the layers' size as pushed and pulled.
	Compressed int64
	// Uncompressed is the layers' size as unpacked on a node.
	Uncompressed int64
}

// String is "linux/arm64 12.3 MiB (33.4 MiB unpacked)".
func (p PlatformImage) String() string {
	return fmt.Sprintf("%s %s (%s unpacked)", platformString(p.Platform), MiB(p.Compressed), MiB(p.Uncompressed))
}

// Describe lists the images of idx in index order with their sizes; it
// reads every layer once to count its unpacked bytes.
func Describe(idx v1.ImageIndex) ([]PlatformImage, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("describe image index: %w", err)
	}
	out := make([]PlatformImage, 0, len(im.Manifests))
	for _, desc := range im.Manifests {
		if !desc.MediaType.IsImage() {
			return nil, fmt.Errorf("describe image index: %s is a %s, not an image", desc.Digest, desc.MediaType)
		}
		img, err := idx.Image(desc.Digest)
		if err != nil {
			return nil, fmt.Errorf("describe image %s: %w", desc.Digest, err)
		}
		p := PlatformImage{Digest: desc.Digest}
		if desc.Platform != nil {
			p.Platform = *desc.Platform
		}
		layers, err := img.Layers()
		if err != nil {
			return nil, fmt.Errorf("describe image %s: %w", desc.Digest, err)
		}
		for _, l := range layers {
			size, err := l.Size()
			if err != nil {
				return nil, fmt.Errorf("describe image %s: layer size: %w", desc.Digest, err)
			}
			n, err := uncompressedSize(l)
			if err != nil {
				return nil, fmt.Errorf("describe image %s: unpack layer: %w", desc.Digest, err)
			}
			p.Compressed += size
			p.Uncompressed += n
		}
		out = append(out, p)
	}
	return out, nil
}

// uncompressedSize counts the bytes of l unpacked.
func uncompressedSize(l v1.Layer) (int64, error) {
	rc, err := l.Uncompressed()
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	return io.Copy(io.Discard, rc)
}
