package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages/pivot"
)

type pivotFlags struct {
	source    clusterFlags
	target    clusterFlags
	namespace string
	dryRun    bool
	force     bool
	output    string
	// mirrorSecret names the Secret in the source that keeps the target's
	// kubeconfig for the mirrors' refresh; "-" keeps none.
	mirrorSecret string
}

func (f *pivotFlags) BindFlags(fs *pflag.FlagSet) {
	f.source.BindFlags(fs)
	fs.StringVar(&f.target.kubeconfig, "to-kubeconfig", "", "kubeconfig of the cluster to move into (required)")
	fs.StringVar(&f.target.context, "to-context", "", "context of --to-kubeconfig to use")
	fs.StringVarP(&f.namespace, "namespace", "n", "capstan-system", "namespace of the ClusterDeployment")
	fs.BoolVar(&f.dryRun, "dry-run", false, "print the plan and the preflight's problems, and change nothing in either cluster")
	fs.BoolVar(&f.force, "force", false, "move even while Machines are provisioning or BareMetalHosts are being registered, inspected, provisioned or deprovisioned (the other preflight checks still apply)")
	fs.StringVarP(&f.output, "output", "o", "text", "plan format with --dry-run: text, yaml or json")
	fs.StringVar(&f.mirrorSecret, "kubeconfig-secret", "", "Secret in the deployment's namespace of the source to keep the target's kubeconfig in (key value), from which a Capstan running in the source refreshes the mirrors' status every --mirror-interval (default NAME-target-kubeconfig; \"-\" keeps none, and the mirrors keep the status they had at the move)")
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
the target (after handing it the deployment's fencing records: from then on
only a Capstan running in the target writes for the deployment), and clean
the source down to paused, read-only mirrors of the Clusters, Machines and
the deployment.

Before anything is paused, a preflight checks that the target answers and
serves every kind that moves, that no Machine or BareMetalHost is in the
middle of provisioning (--force moves anyway), that no object is being
deleted, and that the target has no ClusterDeployment of the same name
that a move did not create. It reports every problem at once, and the
move does not start while there is one.

Each phase done is recorded in the source's ClusterDeployment, in
status.pivot, as the pivot stage records its moves: the target, the phase
and its time, and once the source is clean the objects moved, the mirrors
kept and the Capstan that owns the deployment now. Run the same command
again after an interruption and it resumes after the last phase done,
without a preflight; a move recorded into another cluster is refused.
--dry-run prints the plan and the preflight's problems, exits non-zero if
there are any, and writes nothing.

The move by hand installs nothing and waits for no handover: start Capstan
in the target afterwards (capstan install --kubeconfig FILE), which takes
the deployment over. The target's kubeconfig, self-contained (files
inlined), is kept in Secret NAME-target-kubeconfig of the source (see
--kubeconfig-secret) and recorded in status.pivot, so that the Capstan of
the source refreshes the mirrors' status from the target, as after a pivot
stage.`,
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

// describeCluster names a cluster of a move by hand, as status.pivot and
// the annotations of the move say it (a pivot stage names its target by
// its kubeconfig Secret).
func describeCluster(c *connection) string {
	return "kubeconfig " + c.config.Host
}

func runPivot(ctx context.Context, out io.Writer, f pivotFlags, name string) error {
	return movePivot(ctx, out, f, name, nil)
}

// movePivot is runPivot; interrupt, when set, is called after each step
// recorded, and its error stops the move there as a crash would (tests).
func movePivot(ctx context.Context, out io.Writer, f pivotFlags, name string, interrupt func(pivot.Step) error) error {
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
	from, to := describeCluster(source), describeCluster(target)

	cd, _, err := pivot.ReadDeployment(ctx, source.client, f.namespace, name)
	if err != nil {
		return fmt.Errorf("in the source: %w", err)
	}
	st := cd.Status.Pivot
	last := capstanv1.PivotPhase("")
	if st != nil {
		last = st.Phase
	}
	if err := checkRecordedMove(st, f.namespace, name, to); err != nil {
		return err
	}
	if last.Reached(capstanv1.PivotSourceCleaned) {
		fmt.Fprintf(out, "ClusterDeployment %s/%s was moved into %s already (phase %s done): the move is complete\n", f.namespace, name, to, last)
		if last == capstanv1.PivotSourceCleaned {
			printPivotNext(out, f)
		}
		return nil
	}

	// The move by hand walks nothing in the source afterwards: it holds
	// none of the deployment's Secrets there (pivot.Move.Held).
	move := pivot.Move{
		Namespace: f.namespace, Name: name,
		Source: pivot.Cluster{Name: from, Client: source.client, Discovery: source.disco},
		Target: pivot.Cluster{Name: to, Client: target.client, Discovery: target.disco},
		Force:  f.force,
		DryRun: f.dryRun,
		Check:  func(g *pivot.Graph) error { return checkCarriesCredentials(g, f.namespace) },
		Done: func(s pivot.Step, n int) error {
			if s == pivot.StepPreflight {
				fmt.Fprintf(out, "  ✓ %-12s no problems\n", s)
				return nil
			}
			fmt.Fprintf(out, "  ✓ %-12s %d objects\n", s, n)
			if interrupt != nil {
				return interrupt(s)
			}
			return nil
		},
	}
	secret := mirrorSecretName(f, name)
	if secret != "" {
		move.Start.KubeConfig = &capstanv1.SecretKeyReference{Name: secret, Key: capstanv1.DefaultKubeConfigKey}
		move.Start.KubeConfigNamespace = f.namespace
	}
	move.Starting = func(ctx context.Context, p *pivot.Plan) error {
		fmt.Fprintf(out, "moving %s/%s: %d objects from %s into %s\n", f.namespace, name, p.Graph.Len(), from, to)
		if secret == "" {
			return nil
		}
		return keepTargetKubeconfig(ctx, source.client, f, secret)
	}
	if last != "" && !f.dryRun {
		fmt.Fprintf(out, "resuming the move of %s/%s into %s after phase %s\n", f.namespace, name, to, last)
	}
	p, err := pivot.Run(ctx, move)
	if f.dryRun {
		if err != nil {
			return err
		}
		plan, err := planOf(p, from, to, f.namespace, name)
		if err != nil {
			return err
		}
		if err := printMovePlan(out, plan, f.output); err != nil {
			return err
		}
		if n := len(plan.Preflight); n > 0 {
			return fmt.Errorf("preflight found %s: the move of %s/%s would not start", countOf(n, "problem"), f.namespace, name)
		}
		return nil
	}
	if err != nil {
		if p != nil && p.Moving {
			return fmt.Errorf("%w; run the same command again to resume", err)
		}
		return err
	}
	fmt.Fprintf(out, "moved: %s/%s now lives in %s; the source keeps %d read-only mirrors\n", f.namespace, name, to, mirrorsKept(p))
	printPivotNext(out, f)
	return nil
}

// checkCarriesCredentials refuses a move that would carry the Secret of a
// Capstan's own credentials (capstan-secrets: the root source's password
// and CA) of another namespace than the deployment's: an object the
// deployment applied there that names it would take it along, and a
// pivot carries only what the deployment owns.
func checkCarriesCredentials(g *pivot.Graph, namespace string) error {
	for _, n := range g.Nodes() {
		if id := n.ID(); id.Kind == "Secret" && id.Name == sourceSecretName && id.Namespace != namespace {
			return fmt.Errorf("the move would carry Secret %s/%s, a Capstan's own credentials, which deployment namespace %s does not own; nothing moved: keep the deployment's objects from naming it",
				id.Namespace, id.Name, namespace)
		}
	}
	return nil
}

// mirrorSecretName is the Secret that keeps the target's kubeconfig for
// the mirrors, or "" for none.
func mirrorSecretName(f pivotFlags, name string) string {
	switch f.mirrorSecret {
	case "-":
		return ""
	case "":
		return name + "-target-kubeconfig"
	}
	return f.mirrorSecret
}

// keepTargetKubeconfig writes the target's kubeconfig, minified to its
// context and with every file it names inlined, into Secret secret of the
// source, where the daemon that refreshes the mirrors reads it.
func keepTargetKubeconfig(ctx context.Context, c client.Client, f pivotFlags, secret string) error {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.target.kubeconfig
	raw, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: f.target.context}).RawConfig()
	if err != nil {
		return fmt.Errorf("read --to-kubeconfig: %w", err)
	}
	if f.target.context != "" {
		raw.CurrentContext = f.target.context
	}
	if err := clientcmdapi.MinifyConfig(&raw); err != nil {
		return fmt.Errorf("--to-kubeconfig: %w", err)
	}
	if err := clientcmdapi.FlattenConfig(&raw); err != nil {
		return fmt.Errorf("--to-kubeconfig: inline the files it names: %w", err)
	}
	data, err := clientcmd.Write(raw)
	if err != nil {
		return fmt.Errorf("--to-kubeconfig: %w", err)
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secret, Namespace: f.namespace}}
	_, err = controllerutil.CreateOrUpdate(ctx, c, s, func() error {
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[pivotKubeconfigLabel] = "true"
		s.Data = map[string][]byte{capstanv1.DefaultKubeConfigKey: data}
		return nil
	})
	if err != nil {
		return fmt.Errorf("keep the target's kubeconfig in Secret %s/%s of the source: %w (--kubeconfig-secret - keeps none)", f.namespace, secret, err)
	}
	return nil
}

// pivotKubeconfigLabel marks the Secret a move by hand keeps the target's
// kubeconfig in.
const pivotKubeconfigLabel = "capstan.dev/pivot-kubeconfig"

// checkRecordedMove refuses a move into target while status.pivot records
// one into another cluster, by hand or by a pivot stage.
func checkRecordedMove(st *capstanv1.PivotStatus, namespace, name, target string) error {
	if st == nil || st.Phase == "" || st.Target == target {
		return nil
	}
	by := ""
	if st.Stage != "" {
		by = " by stage " + st.Stage
	}
	if st.Phase.Reached(capstanv1.PivotSourceCleaned) {
		return fmt.Errorf("ClusterDeployment %s/%s was moved into %s already%s (phase %s done), not %s: it lives there now; move it from there",
			namespace, name, st.Target, by, st.Phase, target)
	}
	return fmt.Errorf("ClusterDeployment %s/%s is being moved into %s%s (phase %s done), not %s: finish that move first",
		namespace, name, st.Target, by, st.Phase, target)
}

// printPivotNext says what a move by hand leaves to do: it installs
// nothing and waits for no handover.
func printPivotNext(out io.Writer, f pivotFlags) {
	install := "capstan install --kubeconfig " + f.target.kubeconfig
	if f.target.context != "" {
		install += " --context " + f.target.context
	}
	fmt.Fprintf(out, "next: start Capstan in the target; it owns the deployment (its fencing records) and takes it over:\n  %s\n", install)
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
	// ResumesAfter is the last phase a move recorded: the plan is the rest.
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

// planOf is the driver's plan as --dry-run prints it: the objects kept
// in the source are those of the driver's one mirror rule.
func planOf(p *pivot.Plan, from, to, namespace, name string) (*pivotPlan, error) {
	plan := &pivotPlan{Deployment: namespace + "/" + name, From: from, To: to, ResumesAfter: string(p.Last)}
	g := p.Graph
	for _, n := range g.PauseTargets() {
		plan.Pause = append(plan.Pause, n.ID().String())
	}
	create, err := g.CreateOrder()
	if err != nil {
		return nil, err
	}
	for _, n := range create {
		plan.Create = append(plan.Create, pivotPlanEntry{Object: n.ID().String(), Why: n.Why})
	}
	del, err := g.DeleteOrder()
	if err != nil {
		return nil, err
	}
	for _, n := range del {
		if p.Keep(n.ID()) {
			plan.Mirrors = append(plan.Mirrors, n.ID().String())
		} else {
			plan.Delete = append(plan.Delete, n.ID().String())
		}
	}
	if p.Checked {
		plan.Preflight = preflightOf(pivot.PreflightProblems(p.Preflight))
	}
	return plan, nil
}

// mirrorsKept counts what the move kept in the source.
func mirrorsKept(p *pivot.Plan) int {
	n := 0
	for _, node := range p.Graph.Nodes() {
		if p.Keep(node.ID()) {
			n++
		}
	}
	return n
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
		fmt.Fprintf(out, "\nPreflight: not run; the move resumes after phase %s and was checked when it started\n", p.ResumesAfter)
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
