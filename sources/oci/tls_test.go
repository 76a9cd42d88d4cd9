package oci

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/capstan-dev/capstan/internal/testca"
	"github.com/capstan-dev/capstan/sources"
)

// A registry whose certificate a private CA signed: pushed, checked,
// verified and fetched with the CA in Auth.CABundle, refused with a hint
// naming where the CA goes without it.
func TestRegistryWithPrivateCA(t *testing.T) {
	ctx := testContext(t)
	ca := testca.Must(t, "capstan-oci-test-ca")
	cfg, err := ca.ServerTLS()
	if err != nil {
		t.Fatal(err)
	}
	reg := newTLSRegistry(t, cfg)
	url := reg.URL("clusters/east")
	withCA := Auth{CABundle: ca.PEM}
	pushed, err := Push(ctx, url, overlay(1), PushOptions{Tag: "v1", Auth: withCA})
	if err != nil {
		t.Fatalf("Push with the CA: %v", err)
	}
	key := newSigner(t, false)
	digest := pushed[strings.Index(pushed, "@")+1:]
	key.sign(t, reg, "clusters/east", digest, digest, remote.WithTransport(trusting(t, ca.PEM)))

	s := newSource(t, Options{URL: url, Ref: Ref{Tag: "v1"}, Auth: withCA, Verify: &Verify{PublicKeys: [][]byte{key.pub}}})
	if rev, err := s.Revision(ctx); err != nil || rev != pushed {
		t.Fatalf("Revision with the CA = %q, %v; want %q", rev, err, pushed)
	}
	art, err := s.Fetch(ctx)
	if err != nil {
		t.Fatalf("Fetch (verified) with the CA: %v", err)
	}
	sameFiles(t, art.FS, overlay(1))
	if got := reg.take(); count(got, "GET blobs") == 0 {
		t.Errorf("requests %v: the registry served no blob over https", got)
	}

	const where = "key ca.crt of Secret team-a/registry (spec.source.oci.secretRef)"
	for name, auth := range map[string]Auth{
		"without a CA":       {CAFrom: where},
		"with another CA":    {CABundle: otherCAPEM(t), CAFrom: where},
		"with no CAFrom set": {},
	} {
		t.Run(name, func(t *testing.T) {
			want := where
			if auth.CAFrom == "" {
				want = "key ca.crt of a Secret that spec.source.oci.secretRef names"
			}
			_, err := newSource(t, Options{URL: url, Ref: Ref{Tag: "v1"}, Auth: auth}).Revision(ctx)
			if err == nil || !errors.Is(err, sources.ErrAuth) || !strings.Contains(err.Error(), "not signed by a CA Capstan trusts") ||
				!strings.Contains(err.Error(), want) {
				t.Errorf("Revision = %v; want sources.ErrAuth saying the certificate is not trusted and to put the CA in %s", err, want)
			}
		})
	}
	t.Run("a bundle with no certificate", func(t *testing.T) {
		_, err := New(Options{URL: url, Auth: Auth{CABundle: []byte("garbage"), CAFrom: where}})
		if err == nil || !strings.Contains(err.Error(), where) || !strings.Contains(err.Error(), "holds no PEM certificate") {
			t.Errorf("New = %v, want an error naming %s", err, where)
		}
	})
}

// trusting is a transport that trusts the CA of caPEM, for test helpers
// that write to the registry without a Source.
func trusting(t *testing.T, caPEM []byte) http.RoundTripper {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("CA does not parse")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return tr
}

func otherCAPEM(t *testing.T) []byte {
	t.Helper()
	ca := testca.Must(t, "capstan-unrelated-ca")
	return ca.PEM
}
