package pivot

import (
	"context"
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// Cluster is one side of a move, as clusterctl's mover takes a proxy per
// cluster: what it is called and how it is reached.
type Cluster struct {
	// Name names the cluster in status.pivot, in the annotations of the
	// moved deployment and of the mirrors, and in messages.
	Name string
	// Client reads and writes the cluster.
	Client client.Client
	// Discovery lists the kinds the cluster serves: what can move, and
	// whether the target serves what moves.
	Discovery discovery.DiscoveryInterface
}

// StepPreflight is the phase a move records when its preflight passed and
// it starts; the Mover's steps follow it.
const StepPreflight Step = "Preflight"

// Move is one move of a deployment, as Run carries it out. The pivot
// stage and `capstan pivot` differ only in what they set here.
type Move struct {
	// Namespace and Name are the ClusterDeployment's, in Source.
	Namespace, Name string
	// Source holds the deployment and its status.pivot; Target is where
	// it goes.
	Source, Target Cluster
	// TargetID identifies the Capstan of the target (ClusterID): the
	// fencing records are handed to it and status.pivot names it the
	// owner. Run asks the target when it is empty.
	TargetID string
	// Start is the record a move starts with; Run sets its target, start
	// time and phase (Preflight), and removes whatever else a record that
	// never got a phase held (a preflight's failure, say). Its kubeConfig
	// names the Secret in the source through which the mirrors are
	// refreshed from the target: that Secret stays.
	Start capstanv1.PivotStatus
	// Force moves while machines or hosts are mid-operation.
	Force bool
	// Held names Secrets of the deployment's namespace that the source
	// still reads until a handover: a pivot stage's walk goes on with the
	// deployment's credentials and bootstrap key until the target's
	// Capstan takes over (HeldSecrets). They are copied and stay, and the
	// caller deletes them after the handover (stages.ReleaseHeld).
	Held []string
	// Check, if set, may refuse the graph of a move that has not started
	// yet; its error is returned as it is.
	Check func(*Graph) error
	// BeforePreflight, if set, runs before the preflight of a move that
	// has not started (the stage installs Capstan's CRDs into the target
	// there).
	BeforePreflight func(context.Context) error
	// Starting, if set, runs once the preflight passed, before the first
	// write; its error stops the move with nothing changed.
	Starting func(context.Context, *Plan) error
	// DryRun stops after the preflight: Run returns the plan and writes
	// nothing.
	DryRun bool
	// Done, if set, is called after each phase is recorded with the
	// number of objects it touched; an error stops the move there, as a
	// crash would (the resumed move starts after that phase).
	Done func(Step, int) error
	// Touched, if set, is called after each object a step created, paused
	// or deleted; an error stops the move there, as a crash would.
	Touched func(Step, Object) error
}

// Plan is a move as it stands: where it resumes, its graph, which objects
// stay in the source, and the preflight's verdict.
type Plan struct {
	// Deployment is the ClusterDeployment as read from the source.
	Deployment *capstanv1.ClusterDeployment
	// Last is the phase status.pivot records ("" for a move not started).
	Last capstanv1.PivotPhase
	// Graph is what moves: built from the source up to the copy, from
	// the target after it.
	Graph *Graph
	// Keep says which objects of the graph stay in the source after the
	// move (the mirror rule).
	Keep func(Object) bool
	// Preflight is the preflight's error (PreflightProblems lists its
	// problems); nil when it passed, or did not run (a resumed move).
	Preflight error
	// Checked says whether the preflight ran.
	Checked bool
	// Moving is set once the move wrote anything: an error after it
	// leaves a move to resume.
	Moving bool
}

// Mirrors are the Cluster API Clusters and Machines the source keeps, as
// status.pivot lists them (the deployment is the record itself).
func (p *Plan) Mirrors() []capstanv1.ObjectReference {
	var out []capstanv1.ObjectReference
	for _, n := range p.Graph.Nodes() {
		if id := n.ID(); IsMirror(id) && id.Kind != "ClusterDeployment" && id.Kind != "Secret" {
			out = append(out, capstanv1.ObjectReference{APIVersion: id.APIVersion, Kind: id.Kind, Namespace: id.Namespace, Name: id.Name})
		}
	}
	return out
}

// Run moves the deployment: it resumes after the phase status.pivot
// records, discovers what moves and builds the graph, runs the preflight
// (a move not started yet), records the start, and runs the Mover's steps
// that are left, recording each phase, and with the last what moved, the
// mirrors kept and the target's Capstan as the owner. It is the one
// sequence of a move: the pivot stage and `capstan pivot` call it.
//
// It returns the plan with the error: a preflight that found problems
// fails with a message that names them (their failure classification
// decides: stalled for missing kinds or a deployment in the way), and
// leaves both clusters as they were.
func Run(ctx context.Context, m Move) (*Plan, error) {
	p, err := prepare(ctx, m)
	if err != nil || m.DryRun {
		return p, err
	}
	if p.Preflight != nil {
		return p, fmt.Errorf("preflight: the move of %s/%s did not start, nothing changed: %w", m.Namespace, m.Name, p.Preflight)
	}
	if p.Last.Reached(capstanv1.PivotSourceCleaned) {
		return p, nil
	}
	targetID := m.TargetID
	if targetID == "" {
		if targetID, err = ClusterID(ctx, m.Target.Client); err != nil {
			return p, fmt.Errorf("target %s: %w", m.Target.Name, err)
		}
	}
	record := func(rec *capstanv1.PivotStatus, clear ...string) error {
		return Record(ctx, m.Source.Client, m.Namespace, m.Name, rec, clear...)
	}
	if p.Last == "" {
		if m.Starting != nil {
			if err := m.Starting(ctx, p); err != nil {
				return p, err
			}
		}
		p.Moving = true
		rec := m.Start
		now := metav1.Now()
		rec.Target, rec.StartedAt, rec.Phase = m.Target.Name, &now, capstanv1.PivotPreflight
		_, fields, err := ReadDeployment(ctx, m.Source.Client, m.Namespace, m.Name)
		if err != nil {
			return p, err
		}
		if err := record(&rec, fields...); err != nil {
			return p, err
		}
		if err := done(m, StepPreflight, 0); err != nil {
			return p, err
		}
	}
	p.Moving = true
	counts := map[Step]int{}
	mirrors := p.Mirrors()
	mover := &Mover{
		Source: m.Source.Client, Target: m.Target.Client, SourceName: m.Source.Name, TargetName: m.Target.Name, TargetID: targetID,
		Mirror: p.Keep,
		Touched: func(s Step, o Object) error {
			counts[s]++
			if m.Touched != nil {
				return m.Touched(s, o)
			}
			return nil
		},
		Done: func(s Step) error {
			rec := &capstanv1.PivotStatus{Phase: capstanv1.PivotPhase(s)}
			if s == StepCleanSource {
				// In the same write as the phase: a move recorded clean
				// always names its owner.
				rec.Objects, rec.Mirrors, rec.Owner = int32(p.Graph.Len()), mirrors, targetID
			}
			if err := record(rec); err != nil {
				return err
			}
			return done(m, s, counts[s])
		},
	}
	step := Step("")
	if p.Last != "" && p.Last != capstanv1.PivotPreflight {
		step = Step(p.Last)
	}
	return p, mover.Move(ctx, p.Graph, step)
}

func done(m Move, s Step, n int) error {
	if m.Done == nil {
		return nil
	}
	return m.Done(s, n)
}

// prepare is Run up to the first write: resume, discover, graph, the
// caller's check and the preflight.
func prepare(ctx context.Context, m Move) (*Plan, error) {
	cd, _, err := ReadDeployment(ctx, m.Source.Client, m.Namespace, m.Name)
	if err != nil {
		return nil, fmt.Errorf("in the source: %w", err)
	}
	p := &Plan{Deployment: cd}
	if st := cd.Status.Pivot; st != nil {
		p.Last = st.Phase
	}
	// Up to the copy the source holds everything; after it, the target.
	in := m.Source
	if p.Last.Reached(capstanv1.PivotCopied) {
		in = m.Target
	}
	all, roots, err := Discover(ctx, in.Client, in.Discovery, m.Namespace, m.Name)
	if err != nil {
		return p, err
	}
	if p.Graph, err = BuildGraph(all, roots); err != nil {
		return p, err
	}
	if p.Keep, err = keepRule(ctx, m, cd); err != nil {
		return p, err
	}
	if p.Last != "" {
		// A move that resumes was checked when it started; by now its
		// objects are paused, half copied or arrived, which a preflight
		// would refuse.
		return p, nil
	}
	if m.Check != nil {
		if err := m.Check(p.Graph); err != nil {
			return p, err
		}
	}
	if m.BeforePreflight != nil && !m.DryRun {
		if err := m.BeforePreflight(ctx); err != nil {
			return p, err
		}
	}
	p.Checked = true
	p.Preflight = Preflight(ctx, p.Graph, m.Target.Client, m.Target.Discovery, PreflightOptions{Force: m.Force})
	if p.Preflight != nil && len(PreflightProblems(p.Preflight)) == 0 {
		// Not a problem of the move: the check itself failed.
		return p, p.Preflight
	}
	return p, nil
}

// keepRule is the one mirror rule: what stays in the source after the
// move, because something there still reads it. The Cluster API Clusters
// and Machines and the deployment stay as read-only mirrors (IsMirror);
// the Secret the mirrors are refreshed through (status.pivot.kubeConfig)
// stays; and of the Secrets of the deployment's namespace, those another
// deployment there names (SharedSecrets) stay for good, and those the
// caller holds until a handover (Move.Held) stay until it deletes them.
// Every other object is deleted from the source.
func keepRule(ctx context.Context, m Move, cd *capstanv1.ClusterDeployment) (func(Object) bool, error) {
	shared, err := SharedSecrets(ctx, m.Source.Client, m.Namespace, m.Name)
	if err != nil {
		return nil, err
	}
	via := m.Start.KubeConfig
	viaNamespace := m.Start.KubeConfigNamespace
	if st := cd.Status.Pivot; st != nil && st.Phase != "" && st.KubeConfig != nil {
		via, viaNamespace = st.KubeConfig, st.KubeConfigNamespace
	}
	if viaNamespace == "" {
		viaNamespace = m.Namespace
	}
	held := slices.Clone(m.Held)
	return func(o Object) bool {
		switch {
		case IsMirror(o):
			return true
		case o.Kind != "Secret" || o.APIVersion != "v1":
			return false
		case via != nil && o.Namespace == viaNamespace && o.Name == via.Name:
			return true
		}
		return o.Namespace == m.Namespace && (shared[o.Name] || slices.Contains(held, o.Name))
	}, nil
}
