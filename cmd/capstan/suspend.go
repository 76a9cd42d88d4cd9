package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler"
)

// cliFieldManager is the field manager of every change the CLI makes, so
// that `kubectl get --show-managed-fields` tells them from the daemon's.
const cliFieldManager = "capstan-cli"

// deploymentRef names the one ClusterDeployment a command acts on.
type deploymentRef struct {
	client          client.WithWatch
	namespace, name string
}

func (d deploymentRef) String() string { return d.namespace + "/" + d.name }

// targetFlags are the flags of the commands that act on one deployment.
type targetFlags struct {
	cluster clusterFlags
	scope   scopeFlags
}

func (f *targetFlags) BindFlags(fs *pflag.FlagSet) {
	f.cluster.BindFlags(fs)
	f.scope.BindFlags(fs, false)
}

// ref connects to the cluster and names the deployment of args.
func (f *targetFlags) ref(args []string) (deploymentRef, error) {
	ns, err := f.scope.resolve(&f.cluster)
	if err != nil {
		return deploymentRef{}, err
	}
	c, err := f.cluster.client()
	if err != nil {
		return deploymentRef{}, err
	}
	return deploymentRef{client: c, namespace: ns, name: args[0]}, nil
}

func (d deploymentRef) get(ctx context.Context) (*capstanv1.ClusterDeployment, error) {
	cd := &capstanv1.ClusterDeployment{}
	err := d.client.Get(ctx, client.ObjectKey{Namespace: d.namespace, Name: d.name}, cd)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("ClusterDeployment %s not found", d)
	}
	if err != nil {
		return nil, fmt.Errorf("read ClusterDeployment %s: %w", d, err)
	}
	return cd, nil
}

// patch sends a JSON merge patch, as `kubectl patch --type merge` does,
// under the CLI's field manager.
func (d deploymentRef) patch(ctx context.Context, cd *capstanv1.ClusterDeployment, patch map[string]any) error {
	data, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	if err := d.client.Patch(ctx, cd, client.RawPatch(types.MergePatchType, data), client.FieldOwner(cliFieldManager)); err != nil {
		return fmt.Errorf("patch ClusterDeployment %s: %w", d, err)
	}
	return nil
}

// requestReconcile is the part of a merge patch that asks the daemon to
// reconcile now; refetch also asks for the source's content again.
func requestReconcile(at time.Time, refetch bool) map[string]any {
	stamp := at.UTC().Format(time.RFC3339Nano)
	annotations := map[string]any{reconciler.ReconcileRequestedAnnotation: stamp}
	if refetch {
		annotations[reconciler.RefetchRequestedAnnotation] = stamp
	}
	return map[string]any{"annotations": annotations}
}

func newSuspendCommand() *cobra.Command {
	var f targetFlags
	cmd := &cobra.Command{
		Use:   "suspend NAME",
		Short: "Stop reconciling a ClusterDeployment: nothing is fetched or applied until it is resumed",
		Long: `Suspend sets spec.suspend: true on the ClusterDeployment (a merge patch,
field manager capstan-cli). The daemon then fetches, renders and applies
nothing for it, and corrects no drift, until capstan resume; its status
keeps what it last showed. A stage already waiting ends its current wait
first. kubectl equivalent:

  kubectl patch clusterdeployment NAME -n NS --type merge -p '{"spec":{"suspend":true}}'`,
		Example: `  capstan suspend mgmt-east -n capstan-system`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := f.ref(args)
			if err != nil {
				return err
			}
			return suspend(cmd.Context(), d, cmd.OutOrStdout())
		},
	}
	f.BindFlags(cmd.Flags())
	return cmd
}

func suspend(ctx context.Context, d deploymentRef, out io.Writer) error {
	cd, err := d.get(ctx)
	if err != nil {
		return err
	}
	if cd.Spec.Suspend {
		fmt.Fprintf(out, "ClusterDeployment %s is already suspended\n", d)
		return nil
	}
	if err := d.patch(ctx, cd, map[string]any{"spec": map[string]any{"suspend": true}}); err != nil {
		return err
	}
	fmt.Fprintf(out, "ClusterDeployment %s suspended at %s: nothing is fetched or applied until capstan resume %s -n %s\n",
		d, formatRevisionOr(cd.Status.Revision, "no revision"), d.name, d.namespace)
	return nil
}

func newResumeCommand() *cobra.Command {
	var f targetFlags
	var w waitFlags
	cmd := &cobra.Command{
		Use:   "resume NAME",
		Short: "Reconcile a suspended ClusterDeployment again, at once",
		Long: `Resume removes spec.suspend from the ClusterDeployment and requests a
reconcile (the annotation capstan.dev/reconcile-requested-at), in one merge
patch with field manager capstan-cli: the daemon reconciles it at once
rather than at its next interval. With --wait, resume waits until the
daemon has handled the request (status.lastHandledReconcileAt) and the
deployment is Ready, showing progress on stderr; it fails with the
deployment's message when it stalls or fails. kubectl equivalent:

  kubectl patch clusterdeployment NAME -n NS --type merge \
    -p '{"spec":{"suspend":null},"metadata":{"annotations":{"capstan.dev/reconcile-requested-at":"'"$(date -u +%FT%TZ)"'"}}}'`,
		Example: `  capstan resume mgmt-east -n capstan-system --wait`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := f.ref(args)
			if err != nil {
				return err
			}
			cd, err := d.get(cmd.Context())
			if err != nil {
				return err
			}
			wasSuspended := cd.Spec.Suspend
			patch := map[string]any{"spec": map[string]any{"suspend": nil}, "metadata": requestReconcile(time.Now(), false)}
			if err := d.patch(cmd.Context(), cd, patch); err != nil {
				return err
			}
			requested := cd.Annotations[reconciler.ReconcileRequestedAnnotation]
			out := cmd.OutOrStdout()
			if wasSuspended {
				fmt.Fprintf(out, "ClusterDeployment %s resumed; reconcile requested at %s\n", d, requested)
			} else {
				fmt.Fprintf(out, "ClusterDeployment %s was not suspended; reconcile requested at %s\n", d, requested)
			}
			if !w.wait {
				return nil
			}
			return w.until(cmd.Context(), d, requested, out, cmd.ErrOrStderr())
		},
	}
	f.BindFlags(cmd.Flags())
	w.BindFlags(cmd.Flags())
	return cmd
}

// formatRevisionOr is formatRevision, or none for an empty revision.
func formatRevisionOr(rev, none string) string {
	if rev == "" {
		return none
	}
	return formatRevision(rev)
}
