package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/sources/oci"
)

// startOCIRegistry serves go-containerregistry's registry (the distribution
// API, in memory) on 127.0.0.1 for one test and returns its host:port.
func startOCIRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return ln.Addr().String()
}

func ociOverlay(ns, version string) fstest.MapFS {
	return fstest.MapFS{
		"clusters/app/kustomization.yaml": {Data: []byte("resources: [cm.yaml]\n")},
		"clusters/app/cm.yaml": {Data: []byte(`apiVersion: v1
kind: ConfigMap
metadata: {name: app-config, namespace: ` + ns + `}
data: {version: "` + version + `"}
`)},
	}
}

// The OCI test: push an artifact to a real registry on loopback,
// reconcile it, push a new tag within the semver range, and see the
// deployment move to it.
func TestOCIArtifactFollowsSemverRange(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	host := startOCIRegistry(t)
	url := "oci://" + host + "/clusters/app"
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	first, err := oci.Push(ctx, url, ociOverlay(ns, "1"), oci.PushOptions{Tag: "1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oci.Push(ctx, url, ociOverlay(ns, "9"), oci.PushOptions{Tag: "2.0.0"}); err != nil {
		t.Fatal(err)
	}

	startDaemon(t, nil)
	createDeployment(t, c, ns, "app", capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{OCI: &capstanv1.OCISource{
			URL: url, Ref: capstanv1.OCIRef{SemVer: ">=1.0.0 <2.0.0"},
		}},
		Path:     "clusters/app",
		Interval: &metav1.Duration{Duration: 500 * time.Millisecond},
	})
	waitDeployment(t, c, ns, "app", "Ready at "+first, func(cd *capstanv1.ClusterDeployment) bool {
		return isReady(cd) && cd.Status.Revision == first
	})
	if got := object(t, c, configMapGVK, ns, "app-config"); got == nil || got.Object["data"].(map[string]any)["version"] != "1" {
		t.Fatalf("app-config = %v, want version 1", got)
	}

	pushed := time.Now()
	second, err := oci.Push(ctx, url, ociOverlay(ns, "2"), oci.PushOptions{Tag: "1.1.0"})
	if err != nil {
		t.Fatal(err)
	}
	waitDeployment(t, c, ns, "app", "Ready at "+second, func(cd *capstanv1.ClusterDeployment) bool {
		return isReady(cd) && cd.Status.Revision == second
	})
	t.Logf("push of 1.1.0 to Ready at it: %v (poll interval 500ms)", time.Since(pushed))
	if got := object(t, c, configMapGVK, ns, "app-config"); got == nil || got.Object["data"].(map[string]any)["version"] != "2" {
		t.Fatalf("app-config = %v, want version 2", got)
	}
}

// cosignSign stores an ECDSA signature of digest in repo the way `cosign
// sign --key` does.
func cosignSign(t *testing.T, host, repo, digest string, key *ecdsa.PrivateKey) {
	t.Helper()
	payload := []byte(fmt.Sprintf(`{"critical":{"identity":{"docker-reference":"%s/%s"},"image":{"docker-manifest-digest":%q},"type":"cosign container image signature"},"optional":null}`,
		host, repo, digest))
	sum := sha256.Sum256(payload)
	sig, err := ecdsa.SignASN1(rand.Reader, key, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.Append(mutate.MediaType(empty.Image, types.OCIManifestSchema1), mutate.Addendum{
		Layer:       static.NewLayer(payload, oci.CosignPayloadMediaType),
		Annotations: map[string]string{oci.CosignSignatureAnnotation: base64.StdEncoding.EncodeToString(sig)},
	})
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(host + "/" + repo + ":" + strings.Replace(digest, ":", "-", 1) + ".sig")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}
}

// A deployment that requires a signature never renders an unsigned
// artifact, says so in status, and proceeds once the artifact is signed.
func TestOCIArtifactMustBeSigned(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	host := startOCIRegistry(t)
	url := "oci://" + host + "/clusters/signed"
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	rev, err := oci.Push(ctx, url, ociOverlay(ns, "1"), oci.PushOptions{Tag: "v1"})
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "cosign", Namespace: ns},
		Data:       map[string][]byte{"cosign.pub": pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})},
	}); err != nil {
		t.Fatal(err)
	}

	startDaemon(t, nil)
	createDeployment(t, c, ns, "signed", capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{OCI: &capstanv1.OCISource{
			URL: url, Ref: capstanv1.OCIRef{Tag: "v1"},
			Verify: &capstanv1.OCIVerify{Provider: "cosign", SecretRef: capstanv1.LocalObjectReference{Name: "cosign"}},
		}},
		Path:     "clusters/app",
		Interval: &metav1.Duration{Duration: 500 * time.Millisecond},
	})
	cd := waitDeployment(t, c, ns, "signed", "the unsigned artifact refused in status", func(cd *capstanv1.ClusterDeployment) bool {
		ready := condition(cd, capstanv1.ConditionReady)
		return ready != nil && strings.Contains(ready.Message, "not signed")
	})
	t.Logf("unsigned: %s", condition(cd, capstanv1.ConditionReady).Message)
	if object(t, c, configMapGVK, ns, "app-config") != nil {
		t.Fatal("the unsigned artifact's ConfigMap was applied")
	}

	cosignSign(t, host, "clusters/signed", rev[strings.Index(rev, "@")+1:], key)
	waitDeployment(t, c, ns, "signed", "Ready once signed", func(cd *capstanv1.ClusterDeployment) bool {
		return isReady(cd) && cd.Status.Revision == rev
	})
	if object(t, c, configMapGVK, ns, "app-config") == nil {
		t.Fatal("Ready, but the signed artifact's ConfigMap is missing")
	}
}
