package manifests

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fluxcd/cli-utils/pkg/kstatus/polling"
	"github.com/fluxcd/pkg/ssa"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// FieldManager is the server-side apply field manager `capstan install`
// applies with; the daemon's own is "capstan".
const FieldManager = "capstan-install"

// LeaseName is the leader-election Lease the daemon takes in its namespace.
const LeaseName = "capstan-leader"

// PartOfLabel marks every object the install manifests hold.
const PartOfLabel = "app.kubernetes.io/part-of"

// Installer applies the install manifests to one cluster and waits for the
// daemon, or removes it again.
type Installer struct {
	client   client.Client
	manager  *ssa.ResourceManager
	progress io.Writer
	// Poll is how often Wait looks at the Deployment and its pods.
	Poll time.Duration
}

// NewInstaller returns an Installer that talks to the cluster through c and
// writes one line per step to progress (nil discards them).
func NewInstaller(c client.Client, progress io.Writer) *Installer {
	if progress == nil {
		progress = io.Discard
	}
	poller := polling.NewStatusPoller(c, c.RESTMapper(), polling.Options{})
	return &Installer{
		client:   c,
		manager:  ssa.NewResourceManager(c, poller, ssa.Owner{Field: FieldManager, Group: "capstan.dev"}),
		progress: progress,
		Poll:     time.Second,
	}
}

// Apply applies objs with server-side apply: CRDs and the Namespace first,
// then the rest once those are established. Applying the same objects
// again changes nothing; the change set says so (every entry unchanged).
func (i *Installer) Apply(ctx context.Context, objs []*unstructured.Unstructured) (*ssa.ChangeSet, error) {
	cs, err := i.manager.ApplyAllStaged(ctx, objs, ssa.ApplyOptions{WaitTimeout: time.Minute, WaitInterval: time.Second})
	if err != nil {
		return cs, fmt.Errorf("install: %w", err)
	}
	counts := map[ssa.Action]int{}
	for _, e := range cs.Entries {
		counts[e.Action]++
	}
	fmt.Fprintf(i.progress, "applied %d objects: %d created, %d configured, %d unchanged\n",
		len(cs.Entries), counts[ssa.CreatedAction], counts[ssa.ConfiguredAction], counts[ssa.UnchangedAction])
	if n := counts[ssa.ConfiguredAction]; n > 0 && n <= 10 {
		for _, e := range cs.Entries {
			if e.Action == ssa.ConfiguredAction {
				fmt.Fprintf(i.progress, "  configured %s\n", e.Subject)
			}
		}
	}
	return cs, nil
}

// Wait returns once the Deployment among objs has rolled out (every
// replica updated and available, so its readiness probe passed: the
// daemon's caches are synced) and the daemon holds its leader Lease. It
// reports each change of what it waits for; ctx carries the deadline, and
// the error on expiry says what was still missing, pod by pod.
func (i *Installer) Wait(ctx context.Context, objs []*unstructured.Unstructured) error {
	dep := find(objs, "Deployment")
	if dep == nil {
		return errors.New("wait for Capstan: the manifests have no Deployment")
	}
	key := client.ObjectKeyFromObject(dep)
	last := ""
	for {
		msg, done, err := i.rollout(ctx, key)
		if err != nil {
			return fmt.Errorf("wait for Deployment %s: %w", key, err)
		}
		if done {
			msg, done, err = i.leader(ctx, key.Namespace)
			if err != nil {
				return fmt.Errorf("wait for the leader Lease: %w", err)
			}
		}
		if msg != last {
			fmt.Fprintln(i.progress, msg)
			last = msg
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for Capstan: %s: %w", last, ctx.Err())
		case <-time.After(i.Poll):
		}
	}
}

// rollout says where the Deployment's rollout is, naming the first problem
// of a pod that is not ready.
func (i *Installer) rollout(ctx context.Context, key client.ObjectKey) (string, bool, error) {
	var d appsv1.Deployment
	if err := i.client.Get(ctx, key, &d); err != nil {
		return "", false, err
	}
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	s := d.Status
	if s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == want && s.AvailableReplicas == want && s.Replicas == want {
		return fmt.Sprintf("Deployment %s: %d/%d ready", key, s.AvailableReplicas, want), true, nil
	}
	msg := fmt.Sprintf("Deployment %s: %d/%d ready", key, s.ReadyReplicas, want)
	sel, err := metaSelector(&d)
	if err != nil {
		return "", false, err
	}
	var pods corev1.PodList
	if err := i.client.List(ctx, &pods, client.InNamespace(key.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return "", false, err
	}
	for _, p := range pods.Items {
		if why := podProblem(&p); why != "" {
			return msg + "; pod " + p.Name + ": " + why, false, nil
		}
	}
	return msg, false, nil
}

// podProblem says why a pod is not ready yet, "" if it is.
func podProblem(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return "not scheduled: " + c.Message
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil:
			w := cs.State.Waiting
			out := w.Reason
			if w.Message != "" {
				out += ": " + w.Message
			}
			if t := cs.LastTerminationState.Terminated; t != nil {
				out += fmt.Sprintf(" (last exit %d: %s)", t.ExitCode, strings.TrimSpace(t.Message))
			}
			return out
		case !cs.Ready:
			return "running, not ready yet (readiness probe)"
		}
	}
	if p.Status.Phase == corev1.PodPending {
		return "pending"
	}
	return ""
}

// leader says whether a daemon holds the Lease and renewed it recently.
func (i *Installer) leader(ctx context.Context, namespace string) (string, bool, error) {
	var l coordinationv1.Lease
	err := i.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: LeaseName}, &l)
	if apierrors.IsNotFound(err) {
		return "waiting for a replica to take the leader Lease " + namespace + "/" + LeaseName, false, nil
	}
	if err != nil {
		return "", false, err
	}
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	duration := 15 * time.Second
	if l.Spec.LeaseDurationSeconds != nil {
		duration = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	if holder == "" || l.Spec.RenewTime == nil || time.Since(l.Spec.RenewTime.Time) > duration {
		return "waiting for a replica to take the leader Lease " + namespace + "/" + LeaseName, false, nil
	}
	return "Capstan is running; leader " + holder, true, nil
}

// UninstallOptions tune Uninstall.
type UninstallOptions struct {
	// Force removes Capstan even while ClusterDeployments or LCM objects
	// exist; without it Uninstall refuses. With the CRDs those objects go
	// too; the objects they applied stay in the cluster.
	Force bool
	// KeepCRDs leaves the CRDs, and so every ClusterDeployment and LCM
	// object, in place.
	KeepCRDs bool
}

// Uninstall deletes what objs name: first the Deployment, waiting until its
// pods are gone so that no daemon acts while the rest goes, then
// everything else, the CRDs last, waiting until each is gone. It refuses
// while objects of Capstan's CRDs exist unless opts.Force.
func (i *Installer) Uninstall(ctx context.Context, objs []*unstructured.Unstructured, opts UninstallOptions) error {
	if !opts.Force && !opts.KeepCRDs {
		if err := i.refuseInUse(ctx, objs); err != nil {
			return err
		}
	}
	var first, rest, crds []*unstructured.Unstructured
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment":
			first = append(first, o)
		case "CustomResourceDefinition":
			if !opts.KeepCRDs {
				crds = append(crds, o)
			}
		default:
			rest = append(rest, o)
		}
	}
	if err := i.deleteAndWait(ctx, first); err != nil {
		return err
	}
	if opts.Force && !opts.KeepCRDs {
		if err := i.release(ctx); err != nil {
			return err
		}
	}
	for _, group := range [][]*unstructured.Unstructured{rest, crds} {
		if err := i.deleteAndWait(ctx, group); err != nil {
			return err
		}
	}
	return nil
}

// daemonFinalizer is the daemon's finalizer on ClusterDeployments
// (reconciler.Finalizer): a deployment deleted goes once the daemon has
// carried out its deletion policy.
const daemonFinalizer = "capstan.dev/finalizer"

// release takes the daemon's finalizer off every ClusterDeployment once
// the daemon is gone: nobody else would remove it, so neither they nor
// their CRD could go, and a forced uninstall leaves what they applied.
func (i *Installer) release(ctx context.Context) error {
	list := &unstructured.UnstructuredList{}
	list.SetAPIVersion("capstan.dev/v1alpha1")
	list.SetKind("ClusterDeploymentList")
	err := i.client.List(ctx, list)
	if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("uninstall: list ClusterDeployments: %w", err)
	}
	for _, cd := range list.Items {
		kept := slices.DeleteFunc(slices.Clone(cd.GetFinalizers()), func(f string) bool { return f == daemonFinalizer })
		if len(kept) == len(cd.GetFinalizers()) {
			continue
		}
		patch := client.MergeFromWithOptions(cd.DeepCopy(), client.MergeFromWithOptimisticLock{})
		cd.SetFinalizers(kept)
		if err := i.client.Patch(ctx, &cd, patch); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("uninstall: remove the finalizer of ClusterDeployment %s/%s: %w", cd.GetNamespace(), cd.GetName(), err)
		}
		fmt.Fprintf(i.progress, "released ClusterDeployment %s/%s from the stopped daemon's finalizer\n", cd.GetNamespace(), cd.GetName())
	}
	return nil
}

// refuseInUse fails when objects of the CRDs among objs exist, counting them.
func (i *Installer) refuseInUse(ctx context.Context, objs []*unstructured.Unstructured) error {
	var inUse []string
	for _, crd := range objs {
		if crd.GetKind() != "CustomResourceDefinition" {
			continue
		}
		group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
		kind, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "kind")
		versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
		if len(versions) == 0 {
			continue
		}
		version, _ := versions[0].(map[string]any)["name"].(string)
		list := &unstructured.UnstructuredList{}
		list.SetAPIVersion(group + "/" + version)
		list.SetKind(kind + "List")
		err := i.client.List(ctx, list)
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("uninstall: list %s: %w", kind, err)
		}
		if n := len(list.Items); n > 0 {
			names := make([]string, 0, 3)
			for _, it := range list.Items[:min(n, 3)] {
				names = append(names, it.GetNamespace()+"/"+it.GetName())
			}
			if n > 3 {
				names = append(names, "...")
			}
			inUse = append(inUse, fmt.Sprintf("%d %s (%s)", n, kind, strings.Join(names, ", ")))
		}
	}
	if len(inUse) > 0 {
		sort.Strings(inUse)
		return fmt.Errorf("uninstall: Capstan still manages %s; delete them first, or pass --force to remove them with the CRDs (the objects they applied stay), or --keep-crds to keep them for a later install", strings.Join(inUse, ", "))
	}
	return nil
}

// deleteAndWait deletes objs (ignoring those already gone) and waits until
// every one is gone.
func (i *Installer) deleteAndWait(ctx context.Context, objs []*unstructured.Unstructured) error {
	if len(objs) == 0 {
		return nil
	}
	background := client.PropagationPolicy("Background")
	for _, o := range objs {
		if err := i.client.Delete(ctx, o.DeepCopy(), background); err != nil && !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
			return fmt.Errorf("uninstall: delete %s: %w", describe(o), err)
		}
	}
	var names []string
	for _, o := range objs {
		names = append(names, describe(o))
	}
	fmt.Fprintf(i.progress, "deleting %s\n", strings.Join(names, ", "))
	for {
		var left []string
		for _, o := range objs {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(o.GroupVersionKind())
			err := i.client.Get(ctx, client.ObjectKeyFromObject(o), u)
			switch {
			case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
			case err != nil:
				return fmt.Errorf("uninstall: %s: %w", describe(o), err)
			default:
				left = append(left, describe(o)+finalizers(u))
			}
		}
		if o := find(objs, "Deployment"); o != nil && len(left) == 0 {
			// The daemon is gone only when its pods are.
			if n, err := i.pods(ctx, o); err != nil {
				return err
			} else if n > 0 {
				left = append(left, fmt.Sprintf("%d pod(s) of %s", n, describe(o)))
			}
		}
		if len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("uninstall: still there: %s: %w", strings.Join(left, ", "), ctx.Err())
		case <-time.After(i.Poll):
		}
	}
}

// pods counts the pods the Deployment d ran, by its selector.
func (i *Installer) pods(ctx context.Context, d *unstructured.Unstructured) (int, error) {
	m, _, _ := unstructured.NestedStringMap(d.Object, "spec", "selector", "matchLabels")
	var pods corev1.PodList
	if err := i.client.List(ctx, &pods, client.InNamespace(d.GetNamespace()), client.MatchingLabels(m)); err != nil {
		return 0, fmt.Errorf("uninstall: list pods of %s: %w", describe(d), err)
	}
	return len(pods.Items), nil
}

func finalizers(u *unstructured.Unstructured) string {
	if f := u.GetFinalizers(); len(f) > 0 {
		return " (finalizers " + strings.Join(f, ", ") + ")"
	}
	return ""
}

func describe(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetKind() + " " + o.GetName()
	}
	return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

func find(objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	i := slices.IndexFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == kind })
	if i < 0 {
		return nil
	}
	return objs[i]
}

func metaSelector(d *appsv1.Deployment) (labels.Selector, error) {
	if d.Spec.Selector == nil {
		return labels.Everything(), nil
	}
	return metav1.LabelSelectorAsSelector(d.Spec.Selector)
}
