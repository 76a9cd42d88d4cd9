package stages

import (
	"fmt"
	"slices"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/stages/pivot"
)

// A pivot carries only what the deployment owns. The Capstan a pivot
// installs into its target gets the root source, and the root source's
// credentials, only for a root deployment of Capstan's own namespace (no
// spec.source): the platform's. Any other deployment's target gets
// Capstan without them, and the pivot's message says what was not given
// and what the target needs (docs/kubeconfigs.md).

// InstallFor is what an Installer knows of the deployment whose pivot
// installs Capstan.
type InstallFor struct {
	// Deployment is the deployment that moved.
	Deployment Owner
	// RootSource is true for a root deployment of Capstan's namespace:
	// only then does the target get the root source and its credentials.
	RootSource bool
	// Why says, when RootSource is false, why it is not, for the message.
	Why string
}

// Installed is what Install did, for the pivot's message.
type Installed struct {
	// What was installed ("Capstan IMAGE").
	What string
	// Withheld, when set, says what the target was not given and what it
	// needs instead (the root source's credentials).
	Withheld string
}

// installFor says whether cd may hand the root source's credentials to
// the Capstan its pivot installs.
func (e *Executor) installFor(cd *capstanv1.ClusterDeployment) InstallFor {
	f := InstallFor{Deployment: Owner{Name: cd.Name, Namespace: cd.Namespace}}
	switch {
	case cd.Spec.Source != nil:
		f.Why = fmt.Sprintf("deployment %s/%s has a source of its own (spec.source), whose credentials moved with it", cd.Namespace, cd.Name)
	case e.homeNamespace == "":
		f.Why = fmt.Sprintf("Capstan does not know its own namespace (run it in a pod, or with --leader-election-namespace), so deployment %s/%s is not known to be a root deployment of it", cd.Namespace, cd.Name)
	case cd.Namespace != e.homeNamespace:
		f.Why = fmt.Sprintf("deployment %s/%s is not a root deployment of %s", cd.Namespace, cd.Name, e.homeNamespace)
	default:
		f.RootSource = true
	}
	return f
}

// checkCarries refuses a move of a deployment that is not the platform's
// when it would carry objects of Capstan's own namespace (the Secret of
// the root source's credentials lives there): a rendered object there
// that names such a Secret would hand it to the target. Stalled: nothing
// changed yet.
func (e *Executor) checkCarries(cd *capstanv1.ClusterDeployment, g *pivot.Graph) error {
	home := e.homeNamespace
	if home == "" || cd.Namespace == home {
		return nil
	}
	var theirs []string
	for _, n := range g.Nodes() {
		if id := n.ID(); id.Namespace == home {
			theirs = append(theirs, id.String())
		}
	}
	if len(theirs) == 0 {
		return nil
	}
	slices.Sort(theirs)
	return failure.Stalled(ReasonPivotBlocked, fmt.Errorf("the move of %s/%s would carry objects of Capstan's own namespace %s (%v): a pivot carries only what the deployment owns; "+
		"nothing moved; keep the deployment's objects out of namespace %s", cd.Namespace, cd.Name, home, theirs, home))
}
