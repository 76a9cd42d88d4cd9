package oci

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/capstan-dev/capstan/sources"
)

// signer is a key pair as `cosign generate-key-pair` makes one.
type signer struct {
	key crypto.Signer
	pub []byte // PEM, as cosign.pub
}

func newSigner(t *testing.T, ed bool) signer {
	t.Helper()
	var key crypto.Signer
	var err error
	if ed {
		_, key, err = ed25519.GenerateKey(rand.Reader)
	} else {
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	}
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	return signer{key: key, pub: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})}
}

// sign stores a signature of digest (signing the payload of signedDigest,
// which is digest unless a test replays another artifact's signature) the
// way `cosign sign --key` does: an image tagged sha256-<hex>.sig whose
// layer is the simple-signing payload, signature in an annotation.
func (s signer) sign(t *testing.T, reg *testRegistry, repo, digest, signedDigest string, opts ...remote.Option) {
	t.Helper()
	payload := []byte(fmt.Sprintf(`{"critical":{"identity":{"docker-reference":"%s/%s"},"image":{"docker-manifest-digest":%q},"type":"cosign container image signature"},"optional":null}`,
		reg.Host, repo, signedDigest))
	var sig []byte
	var err error
	if _, ok := s.key.(ed25519.PrivateKey); ok {
		sig, err = s.key.Sign(rand.Reader, payload, crypto.Hash(0))
	} else {
		sum := sha256.Sum256(payload)
		sig, err = s.key.Sign(rand.Reader, sum[:], crypto.SHA256)
	}
	if err != nil {
		t.Fatal(err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:       static.NewLayer(payload, CosignPayloadMediaType),
		Annotations: map[string]string{CosignSignatureAnnotation: base64.StdEncoding.EncodeToString(sig)},
	})
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(reg.Host + "/" + repo + ":" + strings.Replace(digest, ":", "-", 1) + ".sig")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img, opts...); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyCosignSignature(t *testing.T) {
	ctx := testContext(t)
	reg := newTestRegistry(t, "", "")
	trusted, other, ed := newSigner(t, false), newSigner(t, false), newSigner(t, true)
	digestOf := func(rev string) string { return rev[strings.Index(rev, "@")+1:] }

	signed := digestOf(push(t, ctx, reg.URL("signed"), "v1", overlay(1)))
	trusted.sign(t, reg, "signed", signed, signed)
	edSigned := digestOf(push(t, ctx, reg.URL("ed"), "v1", overlay(2)))
	ed.sign(t, reg, "ed", edSigned, edSigned)
	push(t, ctx, reg.URL("unsigned"), "v1", overlay(3))
	wrongKey := digestOf(push(t, ctx, reg.URL("wrong-key"), "v1", overlay(4)))
	other.sign(t, reg, "wrong-key", wrongKey, wrongKey)
	replayed := digestOf(push(t, ctx, reg.URL("replayed"), "v1", overlay(5)))
	trusted.sign(t, reg, "replayed", replayed, signed) // a valid signature, of another artifact

	tests := []struct {
		name string
		repo string
		keys [][]byte
		want string // "" for accepted
	}{
		{name: "signed with the trusted key", repo: "signed", keys: [][]byte{trusted.pub}},
		{name: "signed with one of several keys (Ed25519)", repo: "ed", keys: [][]byte{trusted.pub, ed.pub}},
		{name: "unsigned", repo: "unsigned", keys: [][]byte{trusted.pub}, want: "the artifact is not signed"},
		{name: "signed with another key", repo: "wrong-key", keys: [][]byte{trusted.pub}, want: "made with none of the keys"},
		{name: "a signature of another artifact", repo: "replayed", keys: [][]byte{trusted.pub}, want: "it signs " + signed + ", not this artifact"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSource(t, Options{URL: reg.URL(tt.repo), Ref: Ref{Tag: "v1"}, Verify: &Verify{PublicKeys: tt.keys}})
			reg.take()
			art, err := s.Fetch(ctx)
			got := reg.take()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Fetch = %v, want the signed artifact", err)
				}
				if len(readFiles(t, art)) == 0 {
					t.Error("signed artifact is empty")
				}
				return
			}
			if !errors.Is(err, ErrUnverified) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Fetch = %v, want ErrUnverified containing %q", err, tt.want)
			}
			if art != nil {
				t.Error("Fetch returned an artifact along with the error")
			}
			// The content is never downloaded: at most the signature's
			// payload blob is.
			if n := count(got, "GET blobs"); n > 1 {
				t.Errorf("Fetch of a refused artifact made %v: the content layer was downloaded", got)
			}
		})
	}

	if _, err := New(Options{URL: reg.URL("signed"), Verify: &Verify{PublicKeys: [][]byte{[]byte("not a key")}}}); !errors.Is(err, sources.ErrInvalid) {
		t.Errorf("New with a bad key = %v, want ErrInvalid", err)
	}
	if _, err := New(Options{URL: reg.URL("signed"), Verify: &Verify{}}); !errors.Is(err, sources.ErrInvalid) {
		t.Errorf("New with verification and no key = %v, want ErrInvalid", err)
	}
}

func readFiles(t *testing.T, art *sources.Artifact) []string {
	t.Helper()
	var out []string
	for _, p := range []string{"clusters/east/kustomization.yaml", "clusters/east/cm.yaml"} {
		if _, err := art.FS.Open(p); err == nil {
			out = append(out, p)
		}
	}
	return out
}
