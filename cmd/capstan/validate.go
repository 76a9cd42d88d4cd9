package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/manifests"
	"github.com/capstan-dev/capstan/render"
	"github.com/capstan-dev/capstan/stages"
	"github.com/capstan-dev/capstan/stages/preflight"
)

// validateFlags select what to render, as for render, the cluster to
// look the objects up in, if any, and how to print the report.
type validateFlags struct {
	render  renderFlags
	cluster clusterFlags
	output  string
	crds    []string
}

func (f *validateFlags) BindFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.render.root, "root", "", rootFlagUsage)
	fs.StringVarP(&f.render.deployment, "cluster-deployment", "f", "", "ClusterDeployment file whose path, substitutions and stages to use")
	fs.StringArrayVar(&f.render.substitute, "substitute", nil, "VAR=value for ${VAR} substitution (repeatable)")
	f.render.bindDecryptionKey(fs)
	fs.StringVarP(&f.output, "output", "o", "text", "output format: text (one problem a line), json or yaml")
	fs.StringVar(&f.cluster.kubeconfig, "kubeconfig", "", "run the preflight against the cluster of this kubeconfig (served kinds, namespaces, a server-side dry run of every object); without it (or --context) nothing reads a cluster")
	fs.StringArrayVar(&f.crds, "crds", nil, "offline: also take the CustomResourceDefinitions of this file or directory as installed (repeatable)")
	fs.StringVar(&f.cluster.context, "context", "", "kubeconfig context of the cluster to check against; alone, it reads $KUBECONFIG or ~/.kube/config")
}

// online reports whether validate looks the objects up in a cluster.
func (f *validateFlags) online() bool {
	return f.cluster.kubeconfig != "" || f.cluster.context != ""
}

// servedLookupTimeout bounds each request to the cluster, so that an
// unreachable one fails the command instead of hanging it.
const servedLookupTimeout = 30 * time.Second

func newValidateCommand() *cobra.Command {
	var f validateFlags
	cmd := &cobra.Command{
		Use:   "validate [PATH]",
		Short: "Check what a path renders to before anything is applied",
		Long: `Validate renders a kustomize overlay the way render and the daemon do and
runs the preflight the daemon runs before a revision's first stage, printing
every problem, one per line, with its object, field and file; it exits
non-zero when any is an error, and warnings alone pass. docs/validation.md
lists the checks.

Always: ${VAR}s left unset, stages that select nothing, readiness
expressions over the CEL cost limit, and the network checks of a validate
stage (the network ConfigMap labelled capstan.dev/config: network, Cluster
API Clusters, Metal3 IPPools), and a warning for each Secret not encrypted
with sops in git (capstan.dev/plaintext: allowed on it opts out).

Without --kubeconfig or --context, validate is offline: it reads the files
under --root and checks each object's apiVersion and kind against
Kubernetes' built-in APIs, Capstan's CRDs, the provider CRDs the project
pins (e2e/crds/go.mod, when the repository and its Go module cache are at
hand) and those of --crds. With them, the preflight runs against that
cluster: the kinds it serves (a CRD earlier in the plan counts), the
namespaces that exist, and a server-side dry run of every object whose kind
and namespace exist, which nothing applies.`,
		Example: `  capstan validate --root clusters edge-01
  capstan validate --root . -f clusters/edge-01/clusterdeployment.yaml -o json
  capstan validate --root clusters edge-01 --kubeconfig ~/.kube/mgmt`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.output != "text" && f.output != "json" && f.output != "yaml" {
				return fmt.Errorf("--output %q: expected text, json or yaml", f.output)
			}
			spec, err := f.render.spec(args)
			if err != nil {
				return err
			}
			opts := render.DefaultOptions()
			opts.Path = spec.Path
			opts.Substitute = spec.Substitute
			if opts.Decrypt, err = f.render.keys(); err != nil {
				return err
			}
			where := f.render.where
			rendered, err := render.BuildResult(cmd.Context(), os.DirFS(f.render.root), opts)
			if err != nil {
				return fmt.Errorf("render %s: %w", where, err)
			}
			objs := rendered.Objects
			report := validateReport{Report: preflight.Validate(objs)}
			check := f.checkOffline
			if f.online() {
				check = f.checkServed
			}
			served, err := check(cmd.Context(), spec, rendered)
			if err != nil {
				return fmt.Errorf("validate %s: %w", where, err)
			}
			served.problems = append(served.problems, plaintextProblems(rendered)...)
			report.Served = served
			if err := printReport(cmd.OutOrStdout(), report, len(objs), f.output); err != nil {
				return err
			}
			if all := report.all(); all.Err() != nil {
				return fmt.Errorf("validate %s: preflight found %s", where, all.Summary())
			}
			return nil
		},
	}
	f.BindFlags(cmd.Flags())
	return cmd
}

// servedCheck is what the plan's preflight looked up, and found.
type servedCheck struct {
	// Server is the API server the objects were looked up in; empty
	// offline.
	Server string `json:"server,omitempty"`
	// Offline names what the offline check took as installed.
	Offline string `json:"offline,omitempty"`
	// Objects counts the objects looked up.
	Objects int `json:"objects"`
	// Skipped counts, offline, the objects of groups nothing known
	// defines, which were not judged.
	Skipped int `json:"skipped,omitempty"`
	// problems go into the report's Problems.
	problems []preflight.Problem
}

// validateReport is the preflight report, with the plan's problems.
type validateReport struct {
	preflight.Report
	Served *servedCheck `json:"served,omitempty"`
}

// all returns the report with the plan's problems after the network
// ones.
func (r validateReport) all() preflight.Report {
	all := r.Report
	if r.Served != nil {
		all.Problems = append(append([]preflight.Problem{}, r.Problems...), r.Served.problems...)
	}
	return all
}

// validateOwner owns what the dry runs of validate would apply.
var validateOwner = stages.Owner{Name: "capstan-validate", Namespace: "default"}

// planFor builds the deployment's plan, and returns the problems of one
// that does not build, with every object in one apply stage instead.
func planFor(spec capstanv1.ClusterDeploymentSpec, rendered *render.Result) (*stages.Plan, []preflight.Problem) {
	specs, err := stages.StageSpecs(spec)
	if err == nil {
		var plan *stages.Plan
		if plan, err = stages.BuildPlan(specs, rendered.Objects); err == nil {
			return plan, nil
		}
	}
	var problems []preflight.Problem
	for _, line := range strings.Split(err.Error(), "\n") {
		problems = append(problems, preflight.Problem{Object: "plan", Field: "stages", Message: line})
	}
	one := &stages.Plan{Stages: []stages.Stage{{StageSpec: capstanv1.StageSpec{Name: "All", Action: capstanv1.StageActionApply, AllowEmpty: true}, Objects: rendered.Objects}}}
	return one, problems
}

// renderedOptions tell preflight each object's file, and which objects
// hold a variable left unset or ciphertext.
func renderedOptions(rendered *render.Result) stages.PreflightOptions {
	files := map[*unstructured.Unstructured]string{}
	for i, obj := range rendered.Objects {
		files[obj] = rendered.Files[i]
	}
	return stages.PreflightOptions{
		File: func(obj *unstructured.Unstructured) string { return files[obj] },
		// Ciphertext (validate without a key) cannot be checked: only
		// its plaintext would be applied.
		Skip: func(obj *unstructured.Unstructured) bool {
			return rendered.HasUnset(obj) || rendered.HoldsCiphertext(obj)
		},
	}
}

// unsetProblems are the variables render left unset.
func unsetProblems(rendered *render.Result) []preflight.Problem {
	var out []preflight.Problem
	for _, e := range rendered.Unset {
		msg := e.Err.Error()
		if e.File != "" {
			msg += " (in " + e.File + ")"
		}
		out = append(out, preflight.Problem{Object: strings.Replace(e.Object, "/", " ", 1), Field: e.Field, Message: msg})
	}
	return out
}

// checkServed runs the daemon's preflight of the deployment's plan
// against the cluster: served kinds, namespaces, a dry run of every
// object, empty stages, readiness costs, unset variables.
func (f *validateFlags) checkServed(ctx context.Context, spec capstanv1.ClusterDeploymentSpec, rendered *render.Result) (*servedCheck, error) {
	cfg, err := f.cluster.restConfig()
	if err != nil {
		return nil, err
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = servedLookupTimeout
	}
	c, err := client.NewWithWatch(cfg, client.Options{})
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", cfg.Host, err)
	}
	plan, problems := planFor(spec, rendered)
	problems = append(unsetProblems(rendered), problems...)
	// Discovery gives the schema check the cluster's own OpenAPI documents.
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", cfg.Host, err)
	}
	report, err := stages.NewExecutor(c, stages.WithHomeDiscovery(disco)).Preflight(ctx, plan, validateOwner, renderedOptions(rendered))
	if err != nil {
		return nil, fmt.Errorf("preflight against %s: %w", cfg.Host, err)
	}
	return &servedCheck{Server: cfg.Host, Objects: len(plan.AppliedObjects()), problems: append(problems, report.Problems...)}, nil
}

// checkOffline runs the preflight checks that need no cluster, with the
// CRDs Capstan and the project pin, and those of --crds, taken as
// installed.
func (f *validateFlags) checkOffline(ctx context.Context, spec capstanv1.ClusterDeploymentSpec, rendered *render.Result) (*servedCheck, error) {
	crds, what, err := f.offlineCRDs(ctx)
	if err != nil {
		return nil, err
	}
	plan, problems := planFor(spec, rendered)
	problems = append(unsetProblems(rendered), problems...)
	report, skipped, err := stages.NewOfflineAPIs(crds).CheckOffline(ctx, plan, renderedOptions(rendered))
	if err != nil {
		return nil, err
	}
	return &servedCheck{Offline: what, Objects: len(plan.AppliedObjects()), Skipped: skipped, problems: append(problems, report.Problems...)}, nil
}

// offlineCRDs reads Capstan's CRDs, the pinned provider CRDs when they
// can be found, and those of --crds, and says which it read.
func (f *validateFlags) offlineCRDs(ctx context.Context) ([]*unstructured.Unstructured, string, error) {
	isCRD := func(apiVersion, kind string) bool {
		return kind == "CustomResourceDefinition" && strings.HasPrefix(apiVersion, "apiextensions.k8s.io/")
	}
	crds, err := render.LoadManifests(manifests.CRDs, "crds", isCRD)
	if err != nil {
		return nil, "", fmt.Errorf("read Capstan's CRDs: %w", err)
	}
	what := []string{"built-in APIs", "Capstan's CRDs"}
	if dirs, err := testenv.ProviderCRDDirs(ctx); err == nil {
		for _, dir := range dirs {
			more, err := render.LoadManifests(os.DirFS(dir), ".", isCRD)
			if err != nil {
				return nil, "", fmt.Errorf("read the pinned provider CRDs in %s: %w", dir, err)
			}
			crds = append(crds, more...)
		}
		what = append(what, "the pinned provider CRDs")
	}
	for _, path := range f.crds {
		more, err := loadCRDs(path, isCRD)
		if err != nil {
			return nil, "", fmt.Errorf("--crds %s: %w", path, err)
		}
		crds = append(crds, more...)
		what = append(what, path)
	}
	return crds, strings.Join(what, ", "), nil
}

// loadCRDs reads the CRDs of a directory, or of one file.
func loadCRDs(path string, keep func(apiVersion, kind string) bool) ([]*unstructured.Unstructured, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		return render.LoadManifests(os.DirFS(path), ".", keep)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, err
		}
		if obj.Object != nil && keep(obj.GetAPIVersion(), obj.GetKind()) {
			out = append(out, obj)
		}
	}
}

// printReport prints the report: one line per problem and a summary as
// text, or the report itself as JSON or YAML.
func printReport(w io.Writer, report validateReport, objects int, format string) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(validateReport{Report: report.all(), Served: report.Served})
	case "yaml":
		data, err := yaml.Marshal(validateReport{Report: report.all(), Served: report.Served})
		if err != nil {
			return err
		}
		_, err = w.Write(data)
		return err
	}
	if err := printNetwork(w, report.Report, objects); err != nil || report.Served == nil {
		return err
	}
	served := preflight.Report{Problems: report.Served.problems}
	if _, err := io.WriteString(w, served.GroupedLines(outputWidth(w, 0))); err != nil {
		return err
	}
	summary := served.Summary()
	if len(served.Problems) == 0 {
		summary = "no problems"
	}
	if report.Served.Server != "" {
		_, err := fmt.Fprintf(w, "%s in %s looked up in the API server %s\n", summary, plural(report.Served.Objects, "object"), report.Served.Server)
		return err
	}
	line := fmt.Sprintf("%s in %s checked offline against %s", summary, plural(report.Served.Objects, "object"), report.Served.Offline)
	if report.Served.Skipped > 0 {
		line += fmt.Sprintf("; %s of groups none of them defines not checked (run with --kubeconfig, or add --crds)", plural(report.Served.Skipped, "object"))
	}
	_, err := fmt.Fprintln(w, line)
	return err
}

// printNetwork prints the network checks' problems and summary.
func printNetwork(w io.Writer, report preflight.Report, objects int) error {
	if len(report.Checked) == 0 {
		_, err := fmt.Fprintf(w, "nothing to check in %s: no ConfigMap labelled %s: %s, no Cluster, no IPPool\n",
			plural(objects, "object"), preflight.ConfigLabel, preflight.NetworkConfig)
		return err
	}
	if _, err := io.WriteString(w, report.Lines()); err != nil {
		return err
	}
	summary := report.Summary()
	if len(report.Problems) == 0 {
		summary = "no problems"
	}
	_, err := fmt.Fprintf(w, "%s in %s checked (%s)\n", summary, plural(len(report.Checked), "object"), strings.Join(report.Checked, ", "))
	return err
}
