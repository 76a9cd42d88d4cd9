package forge

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capstan-dev/capstan/internal/testca"
)

// The real Gitea behind an https proxy whose certificate a private CA
// signed: the ca.crt of the token Secret makes the forge reachable; without
// it, the error says to put the CA there, naming the Secret.
func TestGiteaWithPrivateCA(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := realGitea(t)
	repo, pr := giteaRepo(t, ctx, s, "private-ca")
	token, err := s.NewToken(ctx, uniqueName("private-ca"), "write:issue", "write:repository")
	if err != nil {
		t.Fatal(err)
	}
	ca := testca.Must(t, "capstan-forge-test-ca")
	proxy := ca.ProxyFor(t, s.URL())
	base := proxy.URL

	e := controlPlane(t)
	c, err := client.New(e.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := e.CreateNamespace(ctx, "forge-ca")
	if err != nil {
		t.Fatal(err)
	}
	secret := func(name string, data map[string][]byte) types.NamespacedName {
		t.Helper()
		data["token"] = []byte(token)
		if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data}); err != nil {
			t.Fatal(err)
		}
		return types.NamespacedName{Namespace: ns, Name: name}
	}
	forgeFrom := func(key types.NamespacedName) Forge {
		t.Helper()
		creds, err := ReadCredentials(ctx, c, key, "")
		if err != nil {
			t.Fatal(err)
		}
		f, err := New(creds.Apply(Config{Provider: ProviderGitea, BaseURL: base}))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}

	t.Run("with ca.crt in the token Secret the forge answers", func(t *testing.T) {
		f := forgeFrom(secret("with-ca", map[string][]byte{"ca.crt": ca.PEM}))
		prs, err := f.OpenPullRequests(ctx, repo.String(), "main")
		if err != nil || len(prs) != 1 || prs[0].Number != pr.Number {
			t.Fatalf("OpenPullRequests = %+v, %v; want pull request %d", prs, err, pr.Number)
		}
		if _, err := f.UpsertComment(ctx, repo.String(), pr.Number, "plan", "through a private CA"); err != nil {
			t.Fatal(err)
		}
		if err := f.SetCommitStatus(ctx, repo.String(), pr.HeadSHA, Status{State: StatePending, Description: "rolling out"}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("without ca.crt the error names the Secret and the key", func(t *testing.T) {
		f := forgeFrom(secret("without-ca", map[string][]byte{}))
		_, err := f.OpenPullRequests(ctx, repo.String(), "main")
		var fe *Error
		if !errors.As(err, &fe) {
			t.Fatalf("OpenPullRequests = %v, want a *forge.Error", err)
		}
		assertForgeError(t, err, token, []string{"gitea", "not signed by a CA Capstan trusts",
			"key ca.crt of Secret " + ns + "/without-ca (spec.report.pullRequests.secretRef)"})
	})
	t.Run("a ca.crt with no certificate is refused when read", func(t *testing.T) {
		key := secret("garbage-ca", map[string][]byte{"ca.crt": []byte("not a certificate")})
		_, err := ReadCredentials(ctx, c, key, "")
		want := "Secret " + ns + `/garbage-ca: key "ca.crt": holds no PEM certificate`
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), token) {
			t.Errorf("ReadCredentials = %v, want an error containing %q and not the token", err, want)
		}
	})
}
