package pivot

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// HeldSecrets are the Secrets of cd's namespace that its walk reads in
// the source until the handover: the credentials of its source, those it
// reports with (the source's Capstan comments and commits its status until
// then), the bootstrap key (a new one would be one no machine holds) and
// the sops decryption keys (the target's Capstan renders the same
// encrypted files).
func HeldSecrets(cd *capstanv1.ClusterDeployment) []string {
	names := []string{BootstrapKeySecret}
	if d := cd.Spec.Decryption; d != nil && d.SecretRef.Name != "" {
		names = append(names, d.SecretRef.Name)
	}
	if r := cd.Spec.Report; r != nil {
		if r.PullRequests != nil {
			names = append(names, r.PullRequests.SecretRef.Name)
		}
		if r.GitStatus != nil && r.GitStatus.SecretRef != nil {
			names = append(names, r.GitStatus.SecretRef.Name)
		}
	}
	if src := cd.Spec.Source; src != nil {
		if g := src.Git; g != nil {
			if g.SecretRef != nil {
				names = append(names, g.SecretRef.Name)
			}
			if g.Verify != nil {
				names = append(names, g.Verify.SecretRef.Name)
			}
		}
		if o := src.OCI; o != nil {
			if o.SecretRef != nil {
				names = append(names, o.SecretRef.Name)
			}
			if o.Verify != nil {
				names = append(names, o.Verify.SecretRef.Name)
			}
		}
	}
	return names
}

// SharedSecrets are the Secrets of namespace that a deployment there other
// than name (and not a mirror) names: its source's credentials, its forge
// token and status push credentials, its kubeconfigs, and the namespace's
// bootstrap key, which every deployment of the namespace uses. A move
// copies them and leaves them in place: deleting one would break that
// deployment.
func SharedSecrets(ctx context.Context, c client.Reader, namespace, name string) (map[string]bool, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(capstanv1.GroupVersion.WithKind("ClusterDeploymentList"))
	if err := c.List(ctx, list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("list the ClusterDeployments of namespace %s: %w", namespace, err)
	}
	shared := map[string]bool{}
	for i := range list.Items {
		u := &list.Items[i]
		if u.GetName() == name || u.GetAnnotations()[MirrorAnnotation] != "" {
			continue
		}
		other := &capstanv1.ClusterDeployment{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, other); err != nil {
			continue
		}
		for _, held := range HeldSecrets(other) {
			shared[held] = true
		}
		refs := []*capstanv1.KubeConfigReference{other.Spec.KubeConfig}
		for _, st := range other.Spec.Stages {
			refs = append(refs, st.KubeConfig)
		}
		for _, r := range refs {
			if r != nil && r.SecretRef != nil {
				shared[r.SecretRef.Name] = true
			}
		}
	}
	return shared, nil
}
