package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler"
)

// waitFlags are the flags of the commands that can wait for the daemon.
type waitFlags struct {
	wait    bool
	timeout time.Duration
}

func (f *waitFlags) BindFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&f.wait, "wait", false, "wait until the daemon has handled the request and the deployment is Ready; fail with its message if it stalls or fails")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Minute, "how long --wait waits")
}

func newReconcileCommand() *cobra.Command {
	var f targetFlags
	var w waitFlags
	var withSource bool
	cmd := &cobra.Command{
		Use:   "reconcile NAME",
		Short: "Reconcile a ClusterDeployment now instead of at its next interval",
		Long: `Reconcile sets the annotation capstan.dev/reconcile-requested-at to the
current time (a merge patch, field manager capstan-cli). The daemon
reconciles the deployment at once: it asks the source for its revision,
rolls out a new one, and checks every stage. When that reconcile is over it
copies the annotation's value to status.lastHandledReconcileAt.

--with-source also sets capstan.dev/refetch-requested-at to the same value:
the daemon then downloads and renders the source's content again, and walks
every stage, even when the revision has not moved.

--wait waits until status.lastHandledReconcileAt shows the request and the
deployment is Ready, printing progress on stderr; it exits non-zero with the
deployment's message when it stalls or fails, or when --timeout passes.
kubectl equivalent:

  kubectl annotate clusterdeployment NAME -n NS --overwrite \
    capstan.dev/reconcile-requested-at="$(date -u +%FT%TZ)"`,
		Example: `  capstan reconcile mgmt-east -n capstan-system
  capstan reconcile mgmt-east --with-source --wait --timeout 10m`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := f.ref(args)
			if err != nil {
				return err
			}
			cd, err := d.get(cmd.Context())
			if err != nil {
				return err
			}
			if cd.Spec.Suspend {
				return fmt.Errorf("ClusterDeployment %s is suspended: capstan resume %s -n %s reconciles it", d, d.name, d.namespace)
			}
			if err := d.patch(cmd.Context(), cd, map[string]any{"metadata": requestReconcile(time.Now(), withSource)}); err != nil {
				return err
			}
			requested := cd.Annotations[reconciler.ReconcileRequestedAnnotation]
			what := "reconcile"
			if withSource {
				what = "reconcile with the source fetched again"
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "ClusterDeployment %s: %s requested at %s\n", d, what, requested)
			if !w.wait {
				return nil
			}
			return w.until(cmd.Context(), d, requested, out, cmd.ErrOrStderr())
		},
	}
	f.BindFlags(cmd.Flags())
	w.BindFlags(cmd.Flags())
	cmd.Flags().BoolVar(&withSource, "with-source", false, "download and render the source's content again, even at the same revision")
	return cmd
}

// until waits for the outcome of the reconcile requested at requested:
// nil once it is handled and the deployment Ready, an error with the
// deployment's message once it is handled and stalled or failed, or when
// the timeout passes. Each new state is one line on progress.
func (f *waitFlags) until(ctx context.Context, d deploymentRef, requested string, out, progress io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	last := ""
	check := func(cd *capstanv1.ClusterDeployment) (bool, error) {
		done, state, err := outcome(cd, requested)
		if state != last && !done {
			fmt.Fprintf(progress, "waiting: %s\n", state)
		}
		last = state
		if done && err == nil {
			fmt.Fprintf(out, "ClusterDeployment %s is Ready at %s\n", d, formatRevisionOr(cd.Status.Revision, "no revision"))
		}
		return done, err
	}
	err := watchDeployment(ctx, d, check)
	if err != nil && ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("ClusterDeployment %s: not Ready after %s: %s", d, f.timeout, last)
	}
	return err
}

// outcome judges cd against a reconcile request: whether waiting is over,
// a line that says where it is, and the error if it ended badly.
func outcome(cd *capstanv1.ClusterDeployment, requested string) (done bool, state string, err error) {
	if cd.Status.LastHandledReconcileAt != requested {
		return false, "the daemon has not handled the request yet (is a Capstan daemon running?)", nil
	}
	p := phase(cd)
	switch p {
	case phaseReady:
		return true, "Ready", nil
	case phaseStalled, phaseRetrying:
		return true, p, fmt.Errorf("ClusterDeployment %s/%s %s: %s", cd.Namespace, cd.Name, map[string]string{
			phaseStalled: "stalled", phaseRetrying: "failed (the daemon retries it with backoff)"}[p], reasonLine(cd, p))
	case phaseSuspended:
		return true, p, fmt.Errorf("ClusterDeployment %s/%s was suspended while waiting", cd.Namespace, cd.Name)
	}
	state = p
	if cd.Status.CurrentStage != "" && cd.Status.StagesCurrent() {
		state += fmt.Sprintf(", at stage %s (%d/%d ready)", cd.Status.CurrentStage, cd.Status.StagesReady(), len(cd.Status.Stages))
	}
	if c := meta.FindStatusCondition(cd.Status.Conditions, capstanv1.ConditionReady); c != nil && c.Message != "" {
		state += ": " + oneLine(c.Message)
	}
	return false, state, nil
}

// watchDeployment calls check with the deployment as it is, then on every
// change, until check says done or ctx ends. A watch that ends is started
// again from a fresh read.
func watchDeployment(ctx context.Context, d deploymentRef, check func(*capstanv1.ClusterDeployment) (bool, error)) error {
	for {
		cd, err := d.get(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if done, err := check(cd); done {
			return err
		}
		w, err := d.client.Watch(ctx, &capstanv1.ClusterDeploymentList{}, client.InNamespace(d.namespace),
			client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", d.name)},
			&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: cd.ResourceVersion}})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("watch ClusterDeployment %s: %w", d, err)
		}
		done, err := followDeployment(ctx, w, check)
		if done || err != nil {
			return err
		}
	}
}

func followDeployment(ctx context.Context, w watch.Interface, check func(*capstanv1.ClusterDeployment) (bool, error)) (bool, error) {
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case ev, ok := <-w.ResultChan():
			if !ok {
				return false, nil
			}
			switch ev.Type {
			case watch.Deleted:
				return true, errors.New("the ClusterDeployment was deleted while waiting")
			case watch.Added, watch.Modified:
				if cd, ok := ev.Object.(*capstanv1.ClusterDeployment); ok {
					if done, err := check(cd); done {
						return true, err
					}
				}
			default: // an error, such as a resource version too old: read again
				return false, nil
			}
		}
	}
}
