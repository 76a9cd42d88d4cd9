package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
	"github.com/capstan-dev/capstan/stages/pivot"
)

// pivotWatch prints the bootstrap scenario's progress: the deployment's
// stages in the bootstrap cluster, the move, then its stages in the
// target.
type pivotWatch struct {
	boot, target client.Client
	p            *devPrinter
	// bp and tp print the stages of each cluster and time them apart:
	// PivotDone has a time in each.
	bp, tp *devPrinter
	only   string
	root   rootWatch

	// arrived is called once, when the deployment is in the target and
	// no longer suspended: the move handed it over.
	arrived func() error

	name              string
	bootCD, targetCD  *capstanv1.ClusterDeployment
	bootSeen, tgtSeen map[string]string
	phase             capstanv1.PivotPhase
	landed            bool
	// said is the Stalled message printed last, per cluster.
	said map[string]string
}

var _ devFollower = (*pivotWatch)(nil)

// look reads the deployment in both clusters and prints what changed,
// a stall included. It fails only when the target's Capstan cannot start.
func (w *pivotWatch) look(ctx context.Context) error {
	if w.bootSeen == nil {
		w.bootSeen, w.tgtSeen, w.said = map[string]string{}, map[string]string{}, map[string]string{}
	}
	w.root.look(w.p)
	if w.name == "" {
		list := &capstanv1.ClusterDeploymentList{}
		if err := w.boot.List(ctx, list, client.InNamespace(devNamespace)); err != nil || len(list.Items) == 0 {
			return nil // the root source has not applied it yet
		}
		for _, cd := range list.Items {
			if w.only == "" || cd.Name == w.only {
				w.name = cd.Name
				break
			}
		}
		if w.name == "" {
			return nil
		}
	}
	key := client.ObjectKey{Namespace: devNamespace, Name: w.name}
	cd := &capstanv1.ClusterDeployment{}
	if err := w.boot.Get(ctx, key, cd); err == nil {
		w.bootCD = cd
		w.bp.transitions("bootstrap", cd, w.bootSeen)
		if st := cd.Status.Pivot; st != nil && st.Phase != w.phase {
			w.phase = st.Phase
			msg := fmt.Sprintf("move into %s: phase %s done", st.Target, st.Phase)
			if st.Objects > 0 {
				msg += fmt.Sprintf(" (%d objects)", st.Objects)
			}
			w.p.detail("%s", msg)
		}
	}
	there := &capstanv1.ClusterDeployment{}
	if err := w.target.Get(ctx, key, there); err == nil && (w.landed || !there.Spec.Suspend) {
		if !w.landed {
			w.landed = true
			// What was Ready on arrival was printed from the bootstrap.
			for _, st := range there.Status.Stages {
				if st.State == capstanv1.StageReady {
					w.tgtSeen[st.Name] = string(st.State)
				}
			}
			w.p.step("%s arrived in the target cluster, unsuspended", w.name)
			if w.arrived != nil {
				if err := w.arrived(); err != nil {
					return err
				}
			}
		}
		w.targetCD = there
		w.tp.transitions("target", there, w.tgtSeen)
	}
	for where, cd := range w.clusters() {
		msg := stalledMessage(cd)
		if msg != "" && msg != w.said[where] {
			w.p.step("%s stalled in the %s cluster: %s\nstill following: fix the cause in the source, or Ctrl-C", w.name, where, msg)
		}
		w.said[where] = msg
	}
	return nil
}

// clusters are the copies of the deployment seen so far, by cluster.
func (w *pivotWatch) clusters() map[string]*capstanv1.ClusterDeployment {
	out := map[string]*capstanv1.ClusterDeployment{}
	if w.bootCD != nil {
		out["bootstrap"] = w.bootCD
	}
	if w.targetCD != nil {
		out["target"] = w.targetCD
	}
	return out
}

func (w *pivotWatch) stalled() error {
	var errs []error
	for _, where := range []string{"bootstrap", "target"} {
		if cd := w.clusters()[where]; cd != nil {
			if msg := stalledMessage(cd); msg != "" {
				errs = append(errs, fmt.Errorf("%s stalled in the %s cluster: %s", w.name, where, msg))
			}
		}
	}
	return errors.Join(errs...)
}

// done: every stage Ready in the target, and the pivot stage Ready in the
// bootstrap (the handover confirmed, the bootstrap-only objects gone).
func (w *pivotWatch) done() bool {
	return w.targetCD != nil && isDeploymentReady(w.targetCD) && w.bootCD != nil &&
		slices.ContainsFunc(w.bootCD.Status.Stages, func(st capstanv1.StageStatus) bool {
			return st.State == capstanv1.StageReady && isPivot(w.bootCD, st.Name)
		})
}

func isPivot(cd *capstanv1.ClusterDeployment, stage string) bool {
	specs, err := stages.StageSpecs(cd.Spec)
	if err != nil {
		return false
	}
	i := slices.IndexFunc(specs, func(s capstanv1.StageSpec) bool { return s.Name == stage })
	return i >= 0 && specs[i].Action == capstanv1.StageActionPivot
}

// stuckError names where the scenario stopped: the first stage not Ready
// in the cluster that has the deployment's walk, or the handover.
func (w *pivotWatch) stuckError(cause error) error {
	if errors.Is(cause, context.Canceled) {
		return cause
	}
	if w.bootCD == nil {
		return errors.Join(fmt.Errorf("no ClusterDeployment appeared in %s of the bootstrap cluster: is one committed under --path?", devNamespace), w.root.err())
	}
	where, cd := "bootstrap", w.bootCD
	if w.targetCD != nil && !isDeploymentReady(w.targetCD) {
		where, cd = "target", w.targetCD
	}
	for _, st := range cd.Status.Stages {
		if st.State != capstanv1.StageReady {
			msg := fmt.Sprintf("%s not Ready before the timeout: stage %s is %s in the %s cluster: %s", w.name, st.Name, st.State, where, st.Message)
			if p := cd.Status.Pivot; isPivot(cd, st.Name) && p != nil {
				msg += fmt.Sprintf(" (move: phase %q done; %s)", p.Phase, p.Message)
			}
			return errors.New(msg)
		}
	}
	return fmt.Errorf("%s not Ready before the timeout", w.name)
}

// summary prints the stage table of the deployment in the target, where
// each stage acted, and the read-only mirrors the bootstrap keeps.
func (w *pivotWatch) summary(ctx context.Context) {
	out := w.p.out
	cd := w.targetCD
	specs, _ := stages.StageSpecs(cd.Spec)
	pivotAt := slices.IndexFunc(specs, func(s capstanv1.StageSpec) bool { return s.Action == capstanv1.StageActionPivot })
	fmt.Fprintf(out, "\n  %-36s %-28s %10s %9s\n", strings.ToUpper(w.name)+" STAGE", "CLUSTER", "DURATION", "ATTEMPTS")
	// No total: PivotDone in the bootstrap overlaps the target's stages.
	for i, st := range cd.Status.Stages {
		where := "target"
		attempts := st.Attempts
		switch {
		case i == pivotAt:
			where = "bootstrap -> target"
			if b := w.bootStage(st.Name); b != nil {
				attempts = b.Attempts
			}
		case pivotAt >= 0 && i < pivotAt && i < len(specs) && specs[i].KubeConfig != nil:
			where = "target, from the bootstrap"
		case pivotAt >= 0 && i < pivotAt:
			where = "bootstrap"
		}
		timed := w.tp
		if pivotAt < 0 || i <= pivotAt {
			timed = w.bp // up to the handover: the bootstrap's walk
		}
		took := timed.took[cd.Name+"/"+st.Name]
		fmt.Fprintf(out, "  %-36s %-28s %10s %9d\n", st.Name, where, took.Round(100*time.Millisecond), attempts)
	}
	fmt.Fprintln(out)

	fmt.Fprintf(out, "  %-56s %s\n", "MIRRORS IN THE BOOTSTRAP CLUSTER (read-only)", "STATE")
	if b := w.bootCD; b != nil {
		fmt.Fprintf(out, "  %-56s suspended=%t, mirror of %s\n", "ClusterDeployment "+b.Namespace+"/"+b.Name, b.Spec.Suspend, b.Annotations[pivot.MirrorAnnotation])
		if p := b.Status.Pivot; p != nil {
			for _, m := range p.Mirrors {
				u := &unstructured.Unstructured{}
				u.SetAPIVersion(m.APIVersion)
				u.SetKind(m.Kind)
				state := "gone"
				if err := w.boot.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Name}, u); err == nil {
					phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
					paused, _, _ := unstructured.NestedBool(u.Object, "spec", "paused")
					state = fmt.Sprintf("phase %s", phase)
					if paused {
						state += ", paused"
					}
				}
				fmt.Fprintf(out, "  %-56s %s\n", m.Kind+" "+m.Namespace+"/"+m.Name, state)
			}
			ns := p.KubeConfigNamespace
			if ns == "" {
				ns = b.Namespace
			}
			fmt.Fprintf(out, "  %-56s %s\n", "Secret "+ns+"/"+p.KubeConfig.Name, "the target's kubeconfig, to refresh the mirrors")
		}
	}
	fmt.Fprintln(out)
}

func (w *pivotWatch) bootStage(name string) *capstanv1.StageStatus {
	if w.bootCD == nil {
		return nil
	}
	for i := range w.bootCD.Status.Stages {
		if w.bootCD.Status.Stages[i].Name == name {
			return &w.bootCD.Status.Stages[i]
		}
	}
	return nil
}
