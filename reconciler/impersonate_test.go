package reconciler

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
)

// The clients that act as ServiceAccounts are kept while a deployment
// uses them: a deployment that names another ServiceAccount, or goes,
// lets its old one's client go when nobody else uses it.
func TestActorClientsGoWithTheirLastDeployment(t *testing.T) {
	a := newActors(&rest.Config{Host: "https://127.0.0.1:1"}, Scheme(), meta.NewDefaultRESTMapper(nil))
	use := func(user, cd string) {
		t.Helper()
		if _, err := a.client(user, cd); err != nil {
			t.Fatal(err)
		}
	}
	use("system:serviceaccount:a:deployer", "a/x")
	use("system:serviceaccount:a:deployer", "a/y")
	use("system:serviceaccount:a:wide", "a/x") // x names another one now
	if got := a.len(); got != 2 {
		t.Fatalf("%d clients, want 2: deployer (y) and wide (x)", got)
	}
	a.forget("a/y")
	if got := a.len(); got != 1 {
		t.Fatalf("%d clients after y went, want 1 (wide)", got)
	}
	a.forget("a/x")
	if got := a.len(); got != 0 {
		t.Fatalf("%d clients after every deployment went, want 0", got)
	}
}
