package stages

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lcmv1 "github.com/capstan-dev/capstan/api/lcm/v1alpha1"
	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// RolloutFieldManager is the server-side apply field manager the rollout
// writes LCMMachine spec.stateItems with. It owns that field alone, so the
// objects applied from git (field manager "capstan") and the rollout
// never take fields from each other: leave spec.stateItems out of git.
const RolloutFieldManager = "capstan-rollout"

// rolloutStage advances an LCM rollout until it is done or ctx ends. Each
// turn reads the cluster (machines, their LCMCluster, the Nodes), decides
// the next step with planRollout, carries it out, and waits for a watch
// event on anything that could let it go further. Nothing is remembered
// between turns: a restarted daemon continues the rollout, never redoes a
// machine, and never has more machines at work than the batch allows.
func (e *Executor) rolloutStage(ctx context.Context, stage *Stage, owner Owner) Result {
	res := Result{Stage: stage.Name, State: capstanv1.StageInProgress}
	settings, err := rolloutSettingsOf(stage)
	if err != nil {
		return failed(res, Stalled(fmt.Errorf("stage %s: %w", stage.Name, err)))
	}
	scope := rolloutScopeOf(stage)
	if len(scope) == 0 {
		res.State = capstanv1.StageReady
		return res
	}
	feed := newChangeFeed(ctx, e.client)
	defer feed.stop()
	interrupted := func(err error) Result {
		if ctx.Err() != nil {
			return res // the wait slice ended; not a failure
		}
		return failed(res, fmt.Errorf("stage %s: %w", stage.Name, err))
	}
	if err := followRollout(feed, scope); err != nil {
		return interrupted(err)
	}
	for {
		clusters, err := e.observeRollout(ctx, scope)
		if err != nil {
			return interrupted(err)
		}
		res.Progress = rolloutProgress(clusters, settings)
		done := true
		var waiting []string
		for _, c := range clusters {
			step := planRollout(c, settings)
			out, err := e.carryOut(ctx, step, feed)
			if err != nil {
				return interrupted(err)
			}
			if err := e.reportCluster(ctx, c); err != nil {
				return interrupted(err)
			}
			done = done && step.Done && !out.acted
			waiting = append(waiting, out.waiting...)
			waiting = append(waiting, step.Waiting...)
		}
		if done {
			res.State, res.Message = capstanv1.StageReady, ""
			return res
		}
		res.Message = strings.Join(waiting, "; ")
		select {
		case <-ctx.Done():
			return res
		case <-feed.wake:
		}
		// A hundred agents report at once: let a burst of events pass
		// before the next turn reads the cluster, instead of a turn each.
		select {
		case <-ctx.Done():
			return res
		case <-time.After(rolloutSettle):
		}
		select {
		case <-feed.wake: // the turn reads what these events announced
		default:
		}
	}
}

// rolloutSettle is how long a rollout turn waits after the first event for
// more to come.
var rolloutSettle = 50 * time.Millisecond

// followRollout watches what a rollout turn reads: the machines and
// clusters of the scope, and the Nodes.
func followRollout(feed *changeFeed, scope rolloutScope) error {
	var errs []error
	for _, ns := range scope.namespaces() {
		errs = append(errs, feed.follow(lcmMachineGVK, ns), feed.follow(lcmClusterGVK, ns))
	}
	errs = append(errs, feed.follow(corev1.SchemeGroupVersion.WithKind("Node"), ""))
	return errors.Join(errs...)
}

// rolloutOutcome is what carrying out one step did.
type rolloutOutcome struct {
	// acted is true when a write changed the cluster: the step is not
	// the last one even if it said Done.
	acted bool
	// waiting lists the drains that cannot go on yet, and why.
	waiting []string
}

// carryOut uncordons the Nodes of workers back to Ready, then hands the
// machines of the step their items, draining first where the step says
// so. Machines are handled in parallel, each on its own.
func (e *Executor) carryOut(ctx context.Context, step rolloutStep, feed *changeFeed) (rolloutOutcome, error) {
	var (
		mu  sync.Mutex
		out rolloutOutcome
	)
	note := func(acted bool, waiting string) {
		mu.Lock()
		defer mu.Unlock()
		out.acted = out.acted || acted
		if waiting != "" {
			out.waiting = append(out.waiting, waiting)
		}
	}
	for _, h := range step.HandOuts {
		if h.Drain {
			// Evictions wait on pods and budgets: follow them from now on.
			if err := errors.Join(
				feed.follow(corev1.SchemeGroupVersion.WithKind("Pod"), ""),
				feed.follow(policyv1.SchemeGroupVersion.WithKind("PodDisruptionBudget"), ""),
			); err != nil {
				return out, err
			}
			break
		}
	}
	var g errgroup.Group
	g.SetLimit(e.concurrency)
	for _, m := range step.Release {
		g.Go(func() error {
			if err := e.uncordon(ctx, m.Status.Hostname); err != nil {
				return fmt.Errorf("LCMMachine %s/%s: %w", m.Namespace, m.Name, err)
			}
			note(true, "")
			return nil
		})
	}
	for _, h := range step.HandOuts {
		g.Go(func() error {
			m := h.Machine
			if h.Drain {
				if err := e.cordon(ctx, m.Status.Hostname); err != nil {
					return fmt.Errorf("LCMMachine %s/%s: %w", m.Namespace, m.Name, err)
				}
				drain, err := e.evictPods(ctx, m.Status.Hostname)
				if err != nil {
					return fmt.Errorf("LCMMachine %s/%s: %w", m.Namespace, m.Name, err)
				}
				if !drain.Drained {
					note(m.DrainMark == "" || drain.Evicted > 0, fmt.Sprintf("upgrade of %s: %s", m.Name, drain.Waiting))
					return nil
				}
			}
			if err := e.handItems(ctx, m.LCMMachine, h.Items); err != nil {
				return err
			}
			note(true, "")
			return nil
		})
	}
	err := g.Wait()
	return out, err
}

// handItems sets the machine's spec.stateItems with server-side apply, as
// RolloutFieldManager: the items it owns and the target drops are removed.
func (e *Executor) handItems(ctx context.Context, m *lcmv1.LCMMachine, items []lcmv1.StateItem) error {
	if items == nil {
		items = []lcmv1.StateItem{}
	}
	data, err := json.Marshal(items)
	if err != nil {
		return err
	}
	var list []any
	if err := json.Unmarshal(data, &list); err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": lcmMachineGVK.GroupVersion().String(),
		"kind":       lcmMachineGVK.Kind,
		"metadata":   map[string]any{"name": m.Name, "namespace": m.Namespace},
		"spec":       map[string]any{"stateItems": list},
	}}
	if err := e.client.Patch(ctx, u, client.Apply, client.ForceOwnership, client.FieldOwner(RolloutFieldManager)); err != nil {
		return fmt.Errorf("set the StateItems of LCMMachine %s/%s: %w", m.Namespace, m.Name, err)
	}
	return nil
}
