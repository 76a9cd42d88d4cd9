package oci

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/sources"
)

// The way cosign stores a key-based signature of a manifest: an image
// tagged "sha256-<hex>.sig" in the same repository, each of whose layers is
// a simple-signing payload naming the signed digest, with the base64
// signature of that payload in a layer annotation.
const (
	// CosignPayloadMediaType is the media type of a signature layer.
	CosignPayloadMediaType types.MediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
	// CosignSignatureAnnotation holds the base64 signature of the payload.
	CosignSignatureAnnotation = "dev.cosignproject.cosign/signature"
	// cosignPayloadType is the payload's critical.type.
	cosignPayloadType = "cosign container image signature"
	// maxSignatureBytes bounds one signature payload (a few hundred bytes).
	maxSignatureBytes = 64 << 10
	// maxSignatureLayers bounds the signatures checked per artifact.
	maxSignatureLayers = 32
)

// ErrUnverified is wrapped by Fetch's error when Options.Verify is set and
// no signature of the artifact verifies with its keys. It is retryable,
// not stalled: the signature of a new artifact often lands a moment after
// the artifact itself, at the same digest.
var ErrUnverified = failure.New(ReasonUnverified, failure.PolicyRetry, errors.New("signature verification failed"))

// ReasonUnverified is the reason of ErrUnverified.
const ReasonUnverified = "SourceArtifactUnverified"

// Verify says how Fetch checks an artifact's cosign signatures before it
// downloads the content.
type Verify struct {
	// PublicKeys are PEM public keys (ECDSA, RSA or Ed25519) as `cosign
	// generate-key-pair` writes cosign.pub. An artifact is accepted when
	// one of its signatures verifies with one of them.
	PublicKeys [][]byte
}

// parseKeys parses PEM public keys.
func parseKeys(pems [][]byte) ([]crypto.PublicKey, error) {
	if len(pems) == 0 {
		return nil, fmt.Errorf("%w: signature verification needs at least one public key (cosign.pub)", sources.ErrInvalid)
	}
	var keys []crypto.PublicKey
	for i, data := range pems {
		block, _ := pem.Decode(data)
		if block == nil || block.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("%w: verification key %d is not a PEM \"PUBLIC KEY\" block such as cosign.pub", sources.ErrInvalid, i+1)
		}
		key, err := x509.ParsePKIXPublicKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: verification key %d: %w", sources.ErrInvalid, i+1, err)
		}
		switch key.(type) {
		case *ecdsa.PublicKey, *rsa.PublicKey, ed25519.PublicKey:
		default:
			return nil, fmt.Errorf("%w: verification key %d has type %T; use ECDSA, RSA or Ed25519", sources.ErrInvalid, i+1, key)
		}
		keys = append(keys, key)
	}
	return keys, nil
}

// simpleSigning is the part of a cosign payload that binds it to a digest.
type simpleSigning struct {
	Critical struct {
		Image struct {
			DockerManifestDigest string `json:"docker-manifest-digest"`
		} `json:"image"`
		Type string `json:"type"`
	} `json:"critical"`
}

// verifySignature checks that the manifest digest has a cosign signature
// made with one of s's keys.
func (s *Source) verifySignature(ctx context.Context, digest v1.Hash) error {
	sigTag := s.repo.Tag(strings.Replace(digest.String(), ":", "-", 1) + ".sig")
	digestRef := s.repo.Digest(digest.String())
	unverified := func(hint string, cause error) error {
		return s.newError("verify", digestRef, ErrUnverified, hint, cause)
	}
	desc, err := s.puller.Get(ctx, sigTag)
	if err != nil {
		classified := s.classify("verify", sigTag, err)
		if errors.Is(classified, sources.ErrNotFound) {
			return unverified("the artifact is not signed (no "+sigTag.TagStr()+" in the repository): sign it with cosign sign --key", nil)
		}
		return classified
	}
	if len(desc.Manifest) > maxManifestBytes {
		return unverified("the signature manifest is too large", nil)
	}
	m, err := v1.ParseManifest(strings.NewReader(string(desc.Manifest)))
	if err != nil {
		return unverified("the signature manifest does not parse", err)
	}
	var problems []string
	for i, layer := range m.Layers {
		if i == maxSignatureLayers {
			problems = append(problems, fmt.Sprintf("only the first %d signatures were checked", maxSignatureLayers))
			break
		}
		err := s.checkSignatureLayer(ctx, layer, digest)
		if err == nil {
			return nil
		}
		problems = append(problems, fmt.Sprintf("signature %d: %v", i+1, err))
	}
	if len(problems) == 0 {
		problems = append(problems, "the signature manifest holds no signature")
	}
	return unverified("no signature verifies with the keys in spec.source.oci.verify.secretRef ("+strings.Join(problems, "; ")+")", nil)
}

// checkSignatureLayer verifies one signature layer against digest.
func (s *Source) checkSignatureLayer(ctx context.Context, layer v1.Descriptor, digest v1.Hash) error {
	if layer.MediaType != CosignPayloadMediaType {
		return fmt.Errorf("media type %q is not a cosign simple-signing payload", layer.MediaType)
	}
	sigB64, ok := layer.Annotations[CosignSignatureAnnotation]
	if !ok {
		return errors.New("no " + CosignSignatureAnnotation + " annotation")
	}
	sig, err := base64.StdEncoding.DecodeString(sigB64)
	if err != nil {
		return errors.New("the signature is not base64")
	}
	if layer.Size > maxSignatureBytes {
		return fmt.Errorf("the payload is %d bytes, over %d", layer.Size, maxSignatureBytes)
	}
	l, err := s.puller.Layer(ctx, s.repo.Digest(layer.Digest.String()))
	if err != nil {
		return err
	}
	rc, err := l.Compressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	// Reading to the end makes go-containerregistry check the digest.
	payload, err := io.ReadAll(io.LimitReader(rc, maxSignatureBytes+1))
	if err != nil {
		return fmt.Errorf("read the payload: %w", err)
	}
	if len(payload) > maxSignatureBytes {
		return fmt.Errorf("the payload is over %d bytes", maxSignatureBytes)
	}
	if !s.anyKeyVerifies(payload, sig) {
		return errors.New("made with none of the keys")
	}
	var p simpleSigning
	if err := json.Unmarshal(payload, &p); err != nil {
		return fmt.Errorf("the payload is not JSON: %w", err)
	}
	if p.Critical.Type != cosignPayloadType {
		return fmt.Errorf("the payload type is %q, not %q", p.Critical.Type, cosignPayloadType)
	}
	if p.Critical.Image.DockerManifestDigest != digest.String() {
		// A valid signature of another artifact, copied here.
		return fmt.Errorf("it signs %s, not this artifact", p.Critical.Image.DockerManifestDigest)
	}
	return nil
}

// anyKeyVerifies reports whether sig is a signature of payload by one of
// the keys, as cosign makes them: SHA-256, ASN.1 ECDSA, PKCS #1 v1.5 RSA,
// or plain Ed25519.
func (s *Source) anyKeyVerifies(payload, sig []byte) bool {
	sum := sha256.Sum256(payload)
	for _, key := range s.verifyKeys {
		switch k := key.(type) {
		case *ecdsa.PublicKey:
			if ecdsa.VerifyASN1(k, sum[:], sig) {
				return true
			}
		case *rsa.PublicKey:
			if rsa.VerifyPKCS1v15(k, crypto.SHA256, sum[:], sig) == nil {
				return true
			}
		case ed25519.PublicKey:
			if ed25519.Verify(k, payload, sig) {
				return true
			}
		}
	}
	return false
}
