package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/stages"
)

// What `capstan diff` does as the daemon would, where the CLI alone would
// differ: the bootstrap key the daemon renders with, and the
// ServiceAccount it applies a deployment's objects as.

// identityFlags choose as whom the deployment's objects are compared.
type identityFlags struct {
	serviceAccountName string
	asCaller           bool
}

func (f *identityFlags) BindFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.serviceAccountName, "service-account", "",
		"compare the deployment's objects as this ServiceAccount of its namespace (default: its spec.serviceAccountName; name the one of capstan run's --default-service-account here)")
	fs.BoolVar(&f.asCaller, "as-caller", false,
		"compare as your kubeconfig's user, not as the deployment's ServiceAccount")
}

func (f *identityFlags) check() error {
	if f.asCaller && f.serviceAccountName != "" {
		return errors.New("--as-caller and --service-account exclude each other: the first compares as your kubeconfig's user, the second as a ServiceAccount")
	}
	return nil
}

// serviceAccount is the ServiceAccount of the deployment's namespace to
// compare as, "" for the caller.
func (f *identityFlags) serviceAccount(spec capstanv1.ClusterDeploymentSpec) string {
	switch {
	case f.asCaller:
		return ""
	case f.serviceAccountName != "":
		return f.serviceAccountName
	}
	return spec.ServiceAccountName
}

// asCallerHint adds to a refused impersonation how to do without it.
func asCallerHint(err error) error {
	var refused *reconciler.ImpersonationError
	if !errors.As(err, &refused) {
		return err
	}
	return fmt.Errorf("%w; or compare as your kubeconfig's user with --as-caller (then what that user may do is compared, not what the ServiceAccount may)", err)
}

// Where the bootstrap key of a diff came from (bootstrapKeyReport.From).
const (
	keyFromSecret      = "secret"
	keyFromSubstitute  = "substitute"
	keyFromPlaceholder = "placeholder"
)

// bootstrapKeyReport is where the ${CAPSTAN_BOOTSTRAP_SSH_KEY} a diff
// rendered with came from.
type bootstrapKeyReport struct {
	// From is secret (the daemon's key), substitute (--substitute) or
	// placeholder (the daemon has not made its key yet).
	From string `json:"from"`
	// Secret is the daemon's key Secret, namespace/name.
	Secret string `json:"secret"`
	// Note says what a placeholder means for the diff.
	Note string `json:"note,omitempty"`
}

// bootstrapKey gives ${CAPSTAN_BOOTSTRAP_SSH_KEY} the value the daemon
// renders with when t's plan needs it: the public half of the
// deployment's namespace's key Secret, read, never created. Until the
// daemon made it, a placeholder stands in. A value given with
// --substitute is kept; one in the spec is not, since the daemon's key
// replaces it too. nil when the plan needs no key.
func (f *diffFlags) bootstrapKey(ctx context.Context, c client.Reader, t *diffTarget) (*bootstrapKeyReport, error) {
	if !stages.NeedsBootstrapKey(t.spec) {
		return nil, nil
	}
	r := &bootstrapKeyReport{Secret: t.owner.Namespace + "/" + stages.BootstrapKeySecret}
	if slices.ContainsFunc(f.render.substitute, func(kv string) bool { return strings.HasPrefix(kv, stages.BootstrapKeyVar+"=") }) {
		r.From = keyFromSubstitute
		return r, nil
	}
	public, found, err := stages.ReadBootstrapKey(ctx, c, t.owner.Namespace)
	if err != nil {
		return nil, fmt.Errorf("%w; the diff renders ${%s} with this key, as the daemon does; --substitute %s=PUBLIC-KEY gives one instead",
			err, stages.BootstrapKeyVar, stages.BootstrapKeyVar)
	}
	r.From = keyFromSecret
	if !found {
		if public, err = placeholderKey(); err != nil {
			return nil, err
		}
		r.From = keyFromPlaceholder
		r.Note = fmt.Sprintf("bootstrap SSH key: Secret %s does not exist yet, the daemon creates it on its first reconcile; a placeholder key stands in for ${%s} here",
			r.Secret, stages.BootstrapKeyVar)
	}
	setSubstitute(&t.spec, stages.BootstrapKeyVar, public)
	return r, nil
}
