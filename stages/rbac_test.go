package stages

import (
	"errors"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/capstan-dev/capstan/failure"
)

// configMapNamed is an empty ConfigMap ns/name.
func configMapNamed(ns, name string) *unstructured.Unstructured {
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion("v1")
	obj.SetKind("ConfigMap")
	obj.SetNamespace(ns)
	obj.SetName(name)
	return obj
}

func TestApplyErrorsForbiddenByRBACSayHowToGrant(t *testing.T) {
	obj := configMapNamed("apps", "extra")
	gr := schema.GroupResource{Resource: "configmaps"}
	for _, tc := range []struct {
		name      string
		err       error
		wantHint  bool
		wantStall bool
	}{
		{"RBAC refuses the verb", apierrors.NewForbidden(gr, "extra", errors.New(`User "system:serviceaccount:capstan-system:capstan" cannot patch resource "configmaps" in API group "" in the namespace "apps"`)), true, true},
		{"admission refuses a terminating namespace", apierrors.NewForbidden(gr, "extra", errors.New("unable to create new content in namespace apps because it is being terminated")), false, false},
		{"an invalid object stalls", apierrors.NewInvalid(schema.GroupKind{Kind: "ConfigMap"}, "extra", nil), false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := classifyApplyErrorAs(obj, tc.err, "")
			msg := err.Error()
			if !strings.Contains(msg, "ConfigMap/apps/extra") || !strings.Contains(msg, tc.err.Error()) {
				t.Errorf("error %q does not keep the object and the API server's words", msg)
			}
			if got := strings.Contains(msg, AggregateToApplyLabel); got != tc.wantHint {
				t.Errorf("error %q: hint present %v, want %v", msg, got, tc.wantHint)
			}
			if IsStalled(err) != tc.wantStall {
				t.Errorf("stalled %v, want %v", IsStalled(err), tc.wantStall)
			}
			if f, _ := failure.From(err); tc.wantHint && (f == nil || f.RetryAfter == 0) {
				t.Errorf("a stage stalled on RBAC is not looked at again (%+v): granting the permission heals it at the same revision", f)
			}
		})
	}
}

// A deployment that acts as its ServiceAccount is told to grant the
// permission to that ServiceAccount, not to Capstan's.
func TestForbiddenAsAServiceAccountNamesIt(t *testing.T) {
	obj := configMapNamed("other", "theirs")
	denied := apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "theirs",
		errors.New(`User "system:serviceaccount:team-a:deployer" cannot patch resource "configmaps" in API group "" in the namespace "other"`))
	msg := classifyApplyErrorAs(obj, denied, "team-a/deployer").Error()
	for _, want := range []string{"ServiceAccount team-a/deployer", "spec.serviceAccountName", "docs/tenancy.md", denied.Error()} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, AggregateToApplyLabel) {
		t.Errorf("error %q tells to grant Capstan's own ServiceAccount, which is not the one refused", msg)
	}
}

// Capstan itself refused the impersonation: the hint is about Capstan's
// role, not the ServiceAccount's.
func TestImpersonationRefusedNamesCapstansRole(t *testing.T) {
	denied := apierrors.NewForbidden(schema.GroupResource{Resource: "serviceaccounts"}, "deployer",
		errors.New(`User "system:serviceaccount:capstan-system:capstan" cannot impersonate resource "serviceaccounts" in API group "" in the namespace "team-a"`))
	msg := classifyApplyErrorAs(configMapNamed("team-a", "mine"), denied, "team-a/deployer").Error()
	for _, want := range []string{"impersonate on serviceaccounts", "capstan-namespace", "team-a/deployer"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "bind a Role") {
		t.Errorf("error %q tells to grant the ServiceAccount, which was not what was refused", msg)
	}
}
