package image

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Push pushes idx and its images to ref (REGISTRY/REPO:TAG or
// REGISTRY/REPO@DIGEST) with the credentials of the Docker config
// (~/.docker/config.json, as `docker login` leaves them; anonymous
// without). A registry on localhost, 127.0.0.0/8, ::1, a private (RFC 1918)
// address or *.local is tried over https and then plain http, as
// go-containerregistry does by itself for those hosts; every other
// registry needs https.
func Push(ctx context.Context, idx v1.ImageIndex, ref string) error {
	r, err := name.ParseReference(ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("push image: %w", err)
	}
	if err := remote.WriteIndex(r, idx, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return fmt.Errorf("push image %s: %w", ref, err)
	}
	return nil
}
