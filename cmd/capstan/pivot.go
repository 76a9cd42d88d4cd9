package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/capstan-dev/capstan/stages/pivot"
)

// Annotations on the source's ClusterDeployment that record a move by
// hand, so that `capstan pivot` run again resumes it.
const (
	pivotStepAnnotation   = pivot.StepAnnotation
	pivotTargetAnnotation = pivot.TargetAnnotation
)

type pivotFlags struct {
	source    clusterFlags
	target    clusterFlags
	namespace string
	dryRun    bool
	force     bool
	output    string
}

func (f *pivotFlags) BindFlags(fs *pflag.FlagSet) {
	f.source.BindFlags(fs)
	fs.StringVar(&f.target.kubeconfig, "to-kubeconfig", "", "kubeconfig of the cluster to move into (required)")
	fs.StringVar(&f.target.context, "to-context", "", "context of --to-kubeconfig to use")
	fs.StringVarP(&f.namespace, "namespace", "n", "capstan-system", "namespace of the ClusterDeployment")
	fs.BoolVar(&f.dryRun, "dry-run", false, "print the plan and the preflight's problems, and change nothing in either cluster")
	fs.BoolVar(&f.force, "force", false, "move even while Machines are provisioning or BareMetalHosts are being registered, inspected, provisioned or deprovisioned (the other preflight checks still apply)")
	fs.StringVarP(&f.output, "output", "o", "text", "plan format with --dry-run: text, yaml or json")
}

func newPivotCommand() *cobra.Command {
	var f pivotFlags
	cmd := &cobra.Command{
		Use:   "pivot NAME --to-kubeconfig FILE",
		Short: "Move a ClusterDeployment and its cluster's objects into another cluster (by hand; resumable)",
		Long: `Pivot moves what a ClusterDeployment applied, what the controllers
created from it (owned objects, objects labelled with its Clusters' names,
the Secrets its hosts and machines name) and the deployment itself from the
cluster of --kubeconfig into the cluster of --to-kubeconfig, in four steps:
pause the source (Clusters, BareMetalHosts, the deployment), copy into the
target owners first (owner references rewritten, status copied), unpause
the target, and clean the source down to paused, read-only mirrors of the
Clusters, Machines and the deployment.

Before anything is paused, a preflight checks that the target answers and
serves every kind that moves, that no Machine or BareMetalHost is in the
middle of provisioning (--force moves anyway), that no object is being
deleted, and that the target has no ClusterDeployment of the same name
that a move did not create. It reports every problem at once, and the
move does not start while there is one.

Each step is recorded on the source's ClusterDeployment (annotation
capstan.dev/pivot-step); run the same command again after an interruption
and it resumes after the last step done, without a preflight. --dry-run
prints the plan and the preflight's problems, exits non-zero if there are
any, and writes nothing.`,
		Example: `  capstan pivot mgmt --kubeconfig bootstrap.kubeconfig --to-kubeconfig mgmt.kubeconfig --dry-run
  capstan pivot mgmt --kubeconfig bootstrap.kubeconfig --to-kubeconfig mgmt.kubeconfig`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runPivot(cmd.Context(), cmd.OutOrStdout(), f, args[0])
		},
	}
	f.BindFlags(cmd.Flags())
	return cmd
}

// connection is one cluster of a move, as the command reaches it.
type connection struct {
	config *rest.Config
	client client.Client
	disco  discovery.DiscoveryInterface
}

func connect(f clusterFlags) (*connection, error) {
	cfg, err := f.restConfig()
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", cfg.Host, err)
	}
	d, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", cfg.Host, err)
	}
	return &connection{config: cfg, client: c, disco: d}, nil
}

func runPivot(ctx context.Context, out io.Writer, f pivotFlags, name string) error {
	if f.target.kubeconfig == "" {
		return fmt.Errorf("--to-kubeconfig is required: the kubeconfig of the cluster to move into (for a Cluster API cluster, the value of Secret <cluster>-kubeconfig)")
	}
	if f.output != "text" && f.output != "yaml" && f.output != "json" {
		return fmt.Errorf("--output %q: want text, yaml or json", f.output)
	}
	source, err := connect(f.source)
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	target, err := connect(f.target)
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	if source.config.Host == target.config.Host {
		return fmt.Errorf("--kubeconfig and --to-kubeconfig reach the same API server %s: a move needs two clusters", source.config.Host)
	}

	cd := &unstructured.Unstructured{}
	cd.SetAPIVersion("capstan.dev/v1alpha1")
	cd.SetKind("ClusterDeployment")
	if err := source.client.Get(ctx, client.ObjectKey{Namespace: f.namespace, Name: name}, cd); err != nil {
		return fmt.Errorf("read ClusterDeployment %s/%s in the source: %w", f.namespace, name, err)
	}
	last := pivot.Step(cd.GetAnnotations()[pivotStepAnnotation])
	if last != "" && cd.GetAnnotations()[pivotTargetAnnotation] != target.config.Host {
		return fmt.Errorf("ClusterDeployment %s/%s is being moved into %s (step %s done), not %s: finish that move first",
			f.namespace, name, cd.GetAnnotations()[pivotTargetAnnotation], last, target.config.Host)
	}
	if last == pivot.Steps[len(pivot.Steps)-1] {
		fmt.Fprintf(out, "ClusterDeployment %s/%s was moved into %s already\n", f.namespace, name, target.config.Host)
		return nil
	}

	// Up to the copy the source holds everything; after it, the target.
	from := source
	if last != "" && slices.Index(pivot.Steps, last) >= slices.Index(pivot.Steps, pivot.StepCopy) {
		from = target
	}
	all, roots, err := pivot.Discover(ctx, from.client, from.disco, f.namespace, name)
	if err != nil {
		return err
	}
	g, err := pivot.BuildGraph(all, roots)
	if err != nil {
		return err
	}
	plan, err := planOf(g, source.config.Host, target.config.Host, f.namespace, name)
	if err != nil {
		return err
	}
	plan.ResumesAfter = string(last)
	// A move that resumes was checked when it started; by now its objects
	// are paused, half copied or arrived, which a preflight would refuse.
	var preflight error
	if last == "" {
		preflight = pivot.Preflight(ctx, g, target.client, target.disco, pivot.PreflightOptions{Force: f.force})
		problems := pivot.PreflightProblems(preflight)
		if preflight != nil && len(problems) == 0 {
			return preflight
		}
		plan.Preflight = preflightOf(problems)
	}
	if f.dryRun {
		if err := printMovePlan(out, plan, f.output); err != nil {
			return err
		}
		if n := len(plan.Preflight); n > 0 {
			return fmt.Errorf("preflight found %s: the move of %s/%s would not start", countOf(n, "problem"), f.namespace, name)
		}
		return nil
	}
	if preflight != nil {
		return fmt.Errorf("preflight: the move of %s/%s did not start, nothing was changed:\n%w", f.namespace, name, preflight)
	}

	if last != "" {
		fmt.Fprintf(out, "resuming the move of %s/%s into %s after step %s\n", f.namespace, name, target.config.Host, last)
	} else {
		fmt.Fprintf(out, "moving %s/%s: %d objects from %s into %s\n", f.namespace, name, len(plan.Create), source.config.Host, target.config.Host)
	}
	counts := map[pivot.Step]int{}
	m := &pivot.Mover{
		Source: source.client, Target: target.client, SourceName: source.config.Host, TargetName: target.config.Host,
		Touched: func(s pivot.Step, _ pivot.Object) error { counts[s]++; return nil },
		Done: func(s pivot.Step) error {
			fmt.Fprintf(out, "  ✓ %-12s %d objects\n", s, counts[s])
			return recordStep(ctx, source.client, f.namespace, name, s, target.config.Host)
		},
	}
	if err := m.Move(ctx, g, last); err != nil {
		return fmt.Errorf("%w; run the same command again to resume", err)
	}
	fmt.Fprintf(out, "moved: %s/%s now lives in %s; the source keeps %d read-only mirrors\n", f.namespace, name, target.config.Host, len(plan.Mirrors))
	return nil
}

// recordStep writes the last step done on the source's deployment (its
// mirror, which the move keeps).
func recordStep(ctx context.Context, c client.Client, namespace, name string, s pivot.Step, target string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		pivotStepAnnotation: string(s), pivotTargetAnnotation: target,
	}}})
	if err != nil {
		return err
	}
	cd := &unstructured.Unstructured{}
	cd.SetAPIVersion("capstan.dev/v1alpha1")
	cd.SetKind("ClusterDeployment")
	cd.SetNamespace(namespace)
	cd.SetName(name)
	if err := c.Patch(ctx, cd, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("record step %s on ClusterDeployment %s/%s: %w", s, namespace, name, err)
	}
	return nil
}

// pivotPlan is what a move will do, as --dry-run prints it.
type pivotPlan struct {
	Deployment string           `json:"deployment"`
	From       string           `json:"from"`
	To         string           `json:"to"`
	Pause      []string         `json:"pause"`
	Create     []pivotPlanEntry `json:"create"`
	Mirrors    []string         `json:"mirrors"`
	Delete     []string         `json:"delete"`
	// ResumesAfter is the last step a move recorded: the plan is the rest.
	ResumesAfter string `json:"resumesAfter,omitempty"`
	// Preflight are the problems that keep the move from starting: empty
	// when it may start, null when the preflight did not run (a move that
	// resumes was checked when it started).
	Preflight []pivotPlanProblem `json:"preflight"`
}

// pivotPlanProblem is one problem of the preflight.
type pivotPlanProblem struct {
	Check   string   `json:"check"`
	Objects []string `json:"objects,omitempty"`
	Message string   `json:"message"`
}

// preflightOf turns the preflight's problems into the plan's list, empty
// and not nil when there are none: the preflight ran and passed.
func preflightOf(problems []*pivot.PreflightProblem) []pivotPlanProblem {
	out := []pivotPlanProblem{}
	for _, p := range problems {
		e := pivotPlanProblem{Check: string(p.Check), Message: p.Message}
		for _, o := range p.Objects {
			e.Objects = append(e.Objects, o.String())
		}
		out = append(out, e)
	}
	return out
}

func countOf(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

type pivotPlanEntry struct {
	Object string `json:"object"`
	Why    string `json:"why"`
}

func planOf(g *pivot.Graph, from, to, namespace, name string) (*pivotPlan, error) {
	p := &pivotPlan{Deployment: namespace + "/" + name, From: from, To: to}
	for _, n := range g.PauseTargets() {
		p.Pause = append(p.Pause, n.ID().String())
	}
	create, err := g.CreateOrder()
	if err != nil {
		return nil, err
	}
	for _, n := range create {
		p.Create = append(p.Create, pivotPlanEntry{Object: n.ID().String(), Why: n.Why})
	}
	del, err := g.DeleteOrder()
	if err != nil {
		return nil, err
	}
	for _, n := range del {
		if pivot.IsMirror(n.ID()) {
			p.Mirrors = append(p.Mirrors, n.ID().String())
		} else {
			p.Delete = append(p.Delete, n.ID().String())
		}
	}
	return p, nil
}

func printMovePlan(out io.Writer, p *pivotPlan, format string) error {
	switch format {
	case "json":
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(p)
	case "yaml":
		raw, err := yaml.Marshal(p)
		if err != nil {
			return err
		}
		_, err = out.Write(raw)
		return err
	}
	fmt.Fprintf(out, "Move plan for ClusterDeployment %s, from %s into %s (dry run: nothing changed)\n\n", p.Deployment, p.From, p.To)
	fmt.Fprintf(out, "1. Pause in the source (%d): %s\n\n", len(p.Pause), strings.Join(p.Pause, ", "))
	fmt.Fprintf(out, "2. Create in the target, owners first (%d):\n", len(p.Create))
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for i, e := range p.Create {
		fmt.Fprintf(tw, "   %d\t%s\t%s\n", i+1, e.Object, e.Why)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "\n3. Unpause in the target (%d)\n\n", len(p.Pause))
	fmt.Fprintf(out, "4. In the source, keep as paused read-only mirrors (%d): %s\n", len(p.Mirrors), strings.Join(p.Mirrors, ", "))
	fmt.Fprintf(out, "   and delete, dependents first (%d): %s\n", len(p.Delete), strings.Join(p.Delete, ", "))
	switch {
	case p.Preflight == nil:
		fmt.Fprintf(out, "\nPreflight: not run; the move resumes after step %s and was checked when it started\n", p.ResumesAfter)
	case len(p.Preflight) == 0:
		fmt.Fprintf(out, "\nPreflight: no problems; the move may start\n")
	default:
		fmt.Fprintf(out, "\nPreflight: %s; the move would not start:\n", countOf(len(p.Preflight), "problem"))
		for _, e := range p.Preflight {
			fmt.Fprintf(out, "   - %s\n", e.Message)
		}
	}
	return nil
}
