package stages

import (
	"context"
	"fmt"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// PlanPart is the stages of a plan that act on one cluster, for
// DiffParts.
type PlanPart struct {
	// Stages are indexes into the plan's stages.
	Stages []int
	// Executor acts on the part's cluster; nil when the part cannot be
	// compared (NotCompared says why).
	Executor *Executor
	// Cluster names the cluster in the diff (the kubeconfig Secret that
	// reaches it); empty for the cluster the diff runs against.
	Cluster string
	// NotCompared says why the part's stages cannot be compared: its
	// cluster does not exist yet, or its kubeconfig is not usable.
	NotCompared string
	// Home marks the cluster the deployment lives in: when it does not
	// answer, nothing is compared (the diff's error, as DiffPlan's). Any
	// other cluster that does not answer leaves its stages not compared.
	Home bool
}

// PruneVia returns the executor on the cluster an inventory stage's
// objects were applied to, or why that cluster cannot be looked at.
type PruneVia func(capstanv1.InventoryStage) (*Executor, error)

// DiffParts is DiffPlan for a plan whose stages act on several clusters
// (a stage's or the deployment's kubeConfig): each part is compared with
// its own cluster, the objects a revision drops with the cluster they
// were applied to (via; nil: the home part's executor). A stage that
// acts on a cluster that cannot be reached lists its objects as not
// compared, with the reason, and the others are compared as usual: a
// workload cluster that is not built yet does not hide what the revision
// does to the management cluster.
func DiffParts(ctx context.Context, plan *Plan, owner Owner, opts DiffOptions, parts []PlanPart, via PruneVia) (*PlanDiff, error) {
	d := &PlanDiff{Owner: owner, NewRevision: opts.NewRevision, Stages: make([]StageDiff, len(plan.Stages))}
	var home *Executor
	for _, part := range parts {
		if part.Home {
			home = part.Executor
		}
		why := part.NotCompared
		if part.Executor != nil {
			sub := &Plan{Stages: make([]Stage, len(part.Stages)), Files: plan.Files}
			for k, i := range part.Stages {
				sub.Stages[k] = plan.Stages[i]
			}
			pd, err := part.Executor.DiffPlan(ctx, sub, owner, DiffOptions{NewRevision: opts.NewRevision})
			switch {
			case err == nil:
				for k, i := range part.Stages {
					d.Stages[i] = pd.Stages[k]
					d.Stages[i].Cluster = part.Cluster
				}
				d.secrets = append(d.secrets, pd.secrets...)
				continue
			case part.Home || !IsUnreachable(err) || ctx.Err() != nil:
				return nil, err
			}
			why, d.Unanswered = err.Error(), true
		}
		for _, i := range part.Stages {
			d.Stages[i] = notCompared(&plan.Stages[i], part.Cluster, why)
		}
	}
	if via == nil {
		via = func(capstanv1.InventoryStage) (*Executor, error) { return home, nil }
	}
	for _, stage := range Stale(opts.Inventory, plan) {
		skip := func(err error) {
			for _, entry := range stage.Entries {
				d.Prune = append(d.Prune, pruneDiff(entry.ID, entry.Version, stage.Name, DiffNotCompared, "not compared: "+err.Error()))
			}
		}
		e, err := via(stage)
		if err == nil && e == nil {
			err = fmt.Errorf("no cluster to look in")
		}
		switch {
		case IsUnreachable(err):
			skip(err)
			continue
		case err != nil:
			return nil, err
		}
		if err := e.diffPruneStage(ctx, d, stage, owner, opts.Destructive); err != nil {
			if stage.KubeConfig == nil || !IsUnanswered(err) || ctx.Err() != nil {
				return nil, err
			}
			d.Unanswered = true
			skip(err)
		}
	}
	d.scrub()
	return d, nil
}

// notCompared is the diff of a stage whose cluster could not be compared
// with: its objects, each not compared, and why.
func notCompared(stage *Stage, cluster, why string) StageDiff {
	sd := StageDiff{Name: stage.Name, Action: stage.Action, Cluster: cluster, NotCompared: why}
	if stage.Action == capstanv1.StageActionApply || stage.Action == "" || stage.Action == capstanv1.StageActionDelete {
		for _, obj := range stage.Objects {
			od := newObjectDiff(obj)
			od.Action = DiffNotCompared
			sd.Objects = append(sd.Objects, od)
		}
	}
	sd.Works, sd.Runs = true, true
	sd.Why = "not compared: " + why
	return sd
}
