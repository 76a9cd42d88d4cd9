package reconciler

import (
	"context"
	"io"
	"io/fs"
	"log"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/testca"
	"github.com/capstan-dev/capstan/sources"
	"github.com/capstan-dev/capstan/sources/oci"
)

// privateCAFixture is a namespace of the package's control plane and a
// Reconciler that reads its Secrets, with a CA no system trusts.
type privateCAFixture struct {
	ns string
	c  client.Client
	r  *Reconciler
	ca *testca.CA
}

func newPrivateCAFixture(t *testing.T) *privateCAFixture {
	t.Helper()
	env := controlPlane(t)
	c, err := client.New(env.Config, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := env.CreateNamespace(t.Context(), "private-ca")
	if err != nil {
		t.Fatal(err)
	}
	ca := testca.Must(t, "capstan-reconciler-test-ca")
	return &privateCAFixture{ns: ns, c: c, r: &Reconciler{client: c, sources: newTestSourceCache(t, ArtifactOptions{})}, ca: ca}
}

func (f *privateCAFixture) secret(t *testing.T, name string, data map[string][]byte) {
	t.Helper()
	if err := f.c.Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}, Data: data}); err != nil {
		t.Fatal(err)
	}
}

func (f *privateCAFixture) deployment(name string) *capstanv1.ClusterDeployment {
	return &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}}
}

// fetch asks the source for its revision and content as a reconcile does.
func fetch(ctx context.Context, e *sourceEntry) (string, error) {
	rev, err := e.revision(ctx, 0)
	if err != nil {
		return "", err
	}
	art, _, err := e.fetch(ctx, rev)
	if err != nil {
		return "", err
	}
	data, err := fs.ReadFile(art.FS, "cm.yaml")
	return string(data), err
}

var cmYAML = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm}\n"

// A git source over https whose server a private CA signed: the ca.crt of
// spec.source.git.secretRef makes it fetch, for the deployment's source and
// for pull request heads alike; without it the error names the Secret; a
// ca.crt with no certificate is refused before anything is asked.
func TestGitSourceTrustsTheCAOfItsSecret(t *testing.T) {
	f := newPrivateCAFixture(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cert, err := f.ca.ServerCertificate()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := gitserver.New("", gitserver.Options{Username: "capstan", Password: "pw-never-print-me", TLSCertificate: &cert})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	url, err := srv.CreateRepo("infra")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Commit("infra", gitserver.DefaultBranch, map[string]string{"cm.yaml": cmYAML}, "one"); err != nil {
		t.Fatal(err)
	}
	creds := func(extra ...string) map[string][]byte {
		data := map[string][]byte{"username": []byte("capstan"), "password": []byte("pw-never-print-me")}
		for i := 0; i+1 < len(extra); i += 2 {
			data[extra[i]] = []byte(extra[i+1])
		}
		return data
	}
	f.secret(t, "with-ca", creds("ca.crt", string(f.ca.PEM)))
	f.secret(t, "without-ca", creds())
	f.secret(t, "garbage-ca", creds("ca.crt", "not a certificate"))

	for _, tt := range []struct {
		secret     string
		wantErr    string // "": fetched
		wantStalls bool   // refused before the server is asked
	}{
		{secret: "with-ca"},
		{secret: "without-ca", wantErr: "put the CA's certificate (PEM) in key ca.crt of Secret " + f.ns + "/without-ca (spec.source.git.secretRef)"},
		{secret: "garbage-ca", wantErr: "spec.source.git.secretRef: Secret " + f.ns + `/garbage-ca: key "ca.crt": holds no PEM certificate`, wantStalls: true},
	} {
		t.Run(tt.secret, func(t *testing.T) {
			spec := &capstanv1.GitSource{URL: url, SecretRef: &capstanv1.LocalObjectReference{Name: tt.secret}}
			e, err := f.r.gitSourceFor(ctx, f.deployment(tt.secret), spec)
			var got string
			if err == nil {
				got, err = fetch(ctx, e)
			}
			check(t, "source", got, err, tt.wantErr, tt.wantStalls)

			// The head of a pull request is fetched with the same Secret.
			secret, err := f.r.readSecret(ctx, f.deployment(tt.secret), "spec.source.git.secretRef", tt.secret)
			if err != nil {
				t.Fatal(err)
			}
			got = ""
			auth, err := GitAuth(secret)
			if err == nil {
				var art *sources.Artifact
				art, err = FetchRef(ctx, RefFetch{URL: url, Auth: auth, Ref: "refs/heads/" + gitserver.DefaultBranch, Secret: f.ns + "/" + tt.secret})
				if err == nil {
					var data []byte
					data, err = fs.ReadFile(art.FS, "cm.yaml")
					got = string(data)
					_ = art.Remove()
				}
			}
			check(t, "pull request head", got, err, tt.wantErr, tt.wantStalls)
		})
	}
}

// An OCI source whose registry a private CA signed: a Secret with only
// ca.crt (an anonymous registry) is enough; without it the error names the
// Secret.
func TestOCISourceTrustsTheCAOfItsSecret(t *testing.T) {
	f := newPrivateCAFixture(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	reg, err := f.ca.Serve(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	url := "oci://" + strings.TrimPrefix(reg.URL, "https://") + "/clusters/east"
	files := fstest.MapFS{"cm.yaml": {Data: []byte(cmYAML), Mode: 0o644}}
	if _, err := oci.Push(ctx, url, files, oci.PushOptions{Auth: oci.Auth{CABundle: f.ca.PEM}}); err != nil {
		t.Fatal(err)
	}
	f.secret(t, "registry-ca", map[string][]byte{"ca.crt": f.ca.PEM})
	f.secret(t, "other-ca", map[string][]byte{"ca.crt": otherCA(t)})
	f.secret(t, "empty", map[string][]byte{"unrelated": []byte("x")})
	for _, tt := range []struct {
		secret     string
		wantErr    string
		wantStalls bool
	}{
		{secret: "registry-ca"},
		{secret: "other-ca", wantErr: "put the CA's certificate (PEM) in key ca.crt of Secret " + f.ns + "/other-ca (spec.source.oci.secretRef)"},
		{secret: "empty", wantErr: "has no .dockerconfigjson or config.json key (create it with kubectl create secret docker-registry) and no ca.crt key", wantStalls: true},
	} {
		t.Run(tt.secret, func(t *testing.T) {
			spec := &capstanv1.OCISource{URL: url, SecretRef: &capstanv1.LocalObjectReference{Name: tt.secret}}
			e, err := f.r.ociSourceFor(ctx, f.deployment(tt.secret), spec)
			var got string
			if err == nil {
				got, err = fetch(ctx, e)
			}
			check(t, "source", got, err, tt.wantErr, tt.wantStalls)
		})
	}
}

func check(t *testing.T, what, got string, err error, wantErr string, wantStalls bool) {
	t.Helper()
	if wantErr == "" {
		if err != nil || got != cmYAML {
			t.Errorf("%s: cm.yaml = %q, %v; want it fetched", what, got, err)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), wantErr) || (wantStalls && !failure.IsStalled(err)) {
		t.Errorf("%s: error %v; want one containing %q (stalled: %v)", what, err, wantErr, wantStalls)
	}
	if err != nil && strings.Contains(err.Error(), "pw-never-print-me") {
		t.Errorf("%s: error %v holds the password", what, err)
	}
}

func otherCA(t *testing.T) []byte {
	t.Helper()
	ca := testca.Must(t, "capstan-unrelated-ca")
	return ca.PEM
}
