package report

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/sources"
	"github.com/capstan-dev/capstan/sources/git"
	"github.com/capstan-dev/capstan/sources/webhook"
)

// address is where a deployment's status commits go, as its spec (and the
// daemon's root) says, before any Secret is read.
type address struct {
	url, branch string
	// secret names the credentials; zero for none or the root's.
	secret types.NamespacedName
	// root means the root source's credentials.
	root     bool
	interval time.Duration
	// reject, when set, says why the address cannot be used.
	reject string
}

// key identifies the repository, branch and credentials: the deployments
// of one key share commits. A refused address is a key of its own, so
// that a deployment refused (a tenant asking for the root's credentials)
// never shares a batch, and its refusal, with one that may commit there.
func (a address) key() string {
	return fmt.Sprintf("%s|%s|%s|%t|%s", a.url, a.branch, a.secret, a.root, a.reject)
}

// readRef is a branch of a repository someone reads.
type readRef struct{ url, branch string }

// reads returns the branch cd reads, and false for a source that is not a
// git repository.
func reads(cd *capstanv1.ClusterDeployment, root *Root) (readRef, bool) {
	if src := cd.Spec.Source; src != nil {
		if src.Git == nil {
			return readRef{}, false
		}
		return readRef{url: src.Git.URL, branch: branchOr(src.Git.Ref.Branch, git.DefaultBranch)}, true
	}
	if root == nil || root.URL == "" {
		return readRef{}, false
	}
	return readRef{url: root.URL, branch: branchOr(root.Branch, git.DefaultBranch)}, true
}

// addressOf returns where cd's status goes; false when it is not
// reported. It reads nothing: a bad setting gives an address with reject
// set.
func addressOf(cd *capstanv1.ClusterDeployment, root *Root, interval time.Duration) (address, bool) {
	if cd.Spec.Report == nil || cd.Spec.Report.GitStatus == nil {
		if cd.Spec.Source != nil || root == nil || root.StatusBranch == "" || root.URL == "" || !root.serves(cd.Namespace) {
			return address{}, false
		}
		// A deployment of the root source, which reports by default.
		return address{url: root.URL, branch: root.StatusBranch, root: true, interval: interval}, true
	}
	gs := cd.Spec.Report.GitStatus
	a := address{url: gs.URL, branch: branchOr(gs.Branch, capstanv1.DefaultStatusBranch), interval: interval}
	if gs.Interval != nil && gs.Interval.Duration > 0 {
		a.interval = gs.Interval.Duration
	}
	read, isGit := reads(cd, root)
	if a.url == "" {
		if !isGit {
			a.reject = "spec.report.gitStatus.url: the deployment does not read a git repository; set the repository its status commits go to"
			return a, true
		}
		a.url = read.url
	}
	switch {
	case gs.SecretRef != nil:
		a.secret = types.NamespacedName{Namespace: cd.Namespace, Name: gs.SecretRef.Name}
	case cd.Spec.Source != nil && cd.Spec.Source.Git != nil && cd.Spec.Source.Git.SecretRef != nil:
		a.secret = types.NamespacedName{Namespace: cd.Namespace, Name: cd.Spec.Source.Git.SecretRef.Name}
	case cd.Spec.Source == nil && root != nil && sameRepo(a.url, root.URL):
		a.root = true
	}
	if a.root {
		a.reject = rootRefusal(cd, a.branch, root)
	}
	if a.reject == "" && isGit && sameRepo(a.url, read.url) && a.branch == read.branch {
		a.reject = fmt.Sprintf("spec.report.gitStatus.branch %q is the branch the deployment reads: "+
			"a status commit would trigger a reconcile of itself; pick another branch (default %s)", a.branch, capstanv1.DefaultStatusBranch)
	}
	return a, true
}

// rootRefusal says why the root source's credentials may not commit cd's
// status to branch, or "": they commit only for the deployments the root
// source serves, and only to `capstan run --status-branch`. The root
// repository is the platform's: a branch a deployment picks could be one
// the platform deploys from, or protect.
func rootRefusal(cd *capstanv1.ClusterDeployment, branch string, root *Root) string {
	const own = "set spec.report.gitStatus.secretRef to credentials of your own"
	switch {
	case !root.serves(cd.Namespace):
		return fmt.Sprintf("spec.report.gitStatus: the root source's credentials commit only the status of deployments in the namespaces the root source serves "+
			"(Capstan's and capstan run --root-source-namespaces), not %s: %s", cd.Namespace, own)
	case root.StatusBranch == "":
		return fmt.Sprintf("spec.report.gitStatus.branch %q: status commits with the root source's credentials go only to capstan run's --status-branch, "+
			"which is not set: %s, or ask the platform to set --status-branch", branch, own)
	case branch != root.StatusBranch:
		return fmt.Sprintf("spec.report.gitStatus.branch %q: status commits with the root source's credentials go only to capstan run's --status-branch (%s): "+
			"use that branch, or %s", branch, root.StatusBranch, own)
	}
	return ""
}

func branchOr(b, def string) string {
	if b == "" {
		return def
	}
	return b
}

// sameRepo reports whether two repository URLs name the same repository
// in any of their forms (https, ssh, scp-like), as push webhooks match
// them.
func sameRepo(a, b string) bool {
	return webhook.SameRepository(a, b)
}

// target is an address made ready to push to: credentials read, and the
// values to keep out of the files.
type target struct {
	address
	auth     git.Auth
	caFrom   string // where auth's CA is set, for hints
	scrubber *scrubber
}

// secretNames returns the Secrets of cd's namespace whose values must not
// reach a status file: its source's, its report's and its kubeconfigs'.
func secretNames(cd *capstanv1.ClusterDeployment) []string {
	var names []string
	if src := cd.Spec.Source; src != nil {
		if src.Git != nil && src.Git.SecretRef != nil {
			names = append(names, src.Git.SecretRef.Name)
		}
		if src.OCI != nil && src.OCI.SecretRef != nil {
			names = append(names, src.OCI.SecretRef.Name)
		}
	}
	if r := cd.Spec.Report; r != nil && r.GitStatus != nil && r.GitStatus.SecretRef != nil {
		names = append(names, r.GitStatus.SecretRef.Name)
	}
	if k := cd.Spec.KubeConfig; k != nil && k.SecretRef != nil {
		names = append(names, k.SecretRef.Name)
	}
	for _, s := range cd.Spec.Stages {
		if s.KubeConfig != nil && s.KubeConfig.SecretRef != nil {
			names = append(names, s.KubeConfig.SecretRef.Name)
		}
	}
	if d := cd.Spec.Decryption; d != nil && d.SecretRef.Name != "" {
		// The sops keys: never in a comment, whatever quotes them.
		names = append(names, d.SecretRef.Name)
	}
	return names
}

// resolve reads the credentials of a batch's address and the Secrets of
// its deployments. A missing credentials Secret is an error (retried); a
// missing Secret that is only scrubbed is skipped.
func resolve(ctx context.Context, c client.Reader, b batch, root *Root) (*target, error) {
	t := &target{address: b.address, scrubber: &scrubber{}}
	if root != nil {
		t.scrubber.addValue(root.Auth.Password)
		t.scrubber.addValue(string(root.Auth.SSHPrivateKey))
	}
	switch {
	case b.address.root && root != nil:
		t.auth = root.Auth
		t.caFrom = "--source-ca-file or $CAPSTAN_SOURCE_CA of capstan run (the root source's credentials; installed: key CAPSTAN_SOURCE_CA of Secret capstan-secrets)"
	case b.address.secret.Name != "":
		s := &corev1.Secret{}
		if err := c.Get(ctx, b.address.secret, s); err != nil {
			return nil, fmt.Errorf("read the credentials of status commits, Secret %s: %w", b.address.secret, err)
		}
		t.scrubber.add(s.Data)
		auth, err := git.AuthFromSecret(s.Data)
		if err != nil {
			return nil, fmt.Errorf("read the credentials of status commits, Secret %s: %w", b.address.secret, err)
		}
		t.auth = auth
		t.caFrom = sources.CAKeyOf("the credentials of status commits", b.address.secret.String())
	}
	seen := map[types.NamespacedName]bool{b.address.secret: true}
	for _, it := range b.items {
		for _, name := range secretNames(it.cd) {
			key := types.NamespacedName{Namespace: it.cd.Namespace, Name: name}
			if seen[key] {
				continue
			}
			seen[key] = true
			s := &corev1.Secret{}
			if err := c.Get(ctx, key, s); err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				return nil, fmt.Errorf("read Secret %s, whose values are kept out of the status file: %w", key, err)
			}
			t.scrubber.add(s.Data)
		}
	}
	t.scrubber.done()
	return t, nil
}
