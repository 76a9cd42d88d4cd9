package forge

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capstan-dev/capstan/internal/testenv"
)

// One real control plane for the package, started by the first test that
// needs it and stopped by TestMain.
var (
	envOnce sync.Once
	env     *testenv.Env
	envErr  error
)

func controlPlane(t *testing.T) *testenv.Env {
	t.Helper()
	envOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		env, envErr = testenv.Start(ctx, testenv.Options{CRDDirs: []string{"../../../manifests/crds"}})
	})
	if envErr != nil {
		t.Fatal(envErr)
	}
	return env
}

func TestReadCredentials(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := controlPlane(t)
	c, err := client.New(e.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := e.CreateNamespace(ctx, "forge-token")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "forge"},
		Data:       map[string][]byte{"token": []byte(plantedToken + "\n"), "empty": []byte(" \n")},
	}); err != nil {
		t.Fatal(err)
	}
	key := types.NamespacedName{Namespace: ns, Name: "forge"}

	got, err := ReadCredentials(ctx, c, key, "")
	if err != nil || got.Token != plantedToken || got.CABundle != nil {
		t.Errorf("ReadCredentials(default key) = %q, %v; want the token without its newline and no CA", got.Token, err)
	}
	for _, tc := range []struct {
		name, secret, key, want string
	}{
		{"a missing key names the Secret and the key", "forge", "password", `Secret ` + ns + `/forge: it has no key "password"`},
		{"an empty value is refused", "forge", "empty", `key "empty" is empty`},
		{"a missing Secret names it", "absent", "", `Secret ` + ns + `/absent`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadCredentials(ctx, c, types.NamespacedName{Namespace: ns, Name: tc.secret}, tc.key)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), plantedToken) {
				t.Errorf("error %v, want one containing %q and not the token", err, tc.want)
			}
		})
	}
}

// TestPullRequestReportValidation pins what the API server refuses in
// spec.report.pullRequests.
func TestPullRequestReportValidation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := controlPlane(t)
	c, err := client.New(e.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := e.CreateNamespace(ctx, "forge-api")
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		name string
		pr   map[string]any
		want string // empty: accepted
	}{
		{"github.com needs no base URL", map[string]any{"provider": "github", "repository": "acme/infra", "secretRef": map[string]any{"name": "forge"}}, ""},
		{"a GitLab project path may have subgroups", map[string]any{"provider": "gitlab", "repository": "acme/platform/infra", "secretRef": map[string]any{"name": "forge"}}, ""},
		{"gitea needs a base URL", map[string]any{"provider": "gitea", "secretRef": map[string]any{"name": "forge"}}, "a gitea forge needs baseURL"},
		{"an unknown provider is refused", map[string]any{"provider": "bitbucket", "secretRef": map[string]any{"name": "forge"}}, "spec.report.pullRequests.provider"},
		{"a repository is owner/name", map[string]any{"provider": "github", "repository": "infra", "secretRef": map[string]any{"name": "forge"}}, "spec.report.pullRequests.repository"},
		{"a base URL is http(s)", map[string]any{"provider": "gitlab", "baseURL": "gitlab.example.com", "secretRef": map[string]any{"name": "forge"}}, "spec.report.pullRequests.baseURL"},
		{"the token's Secret is required", map[string]any{"provider": "github"}, "spec.report.pullRequests.secretRef"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "capstan.dev/v1alpha1", "kind": "ClusterDeployment",
				"metadata": map[string]any{"namespace": ns, "name": fmt.Sprintf("pr-%d", i)},
				"spec":     map[string]any{"path": "clusters/a", "report": map[string]any{"pullRequests": tc.pr}},
			}}
			err := c.Create(ctx, u)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
