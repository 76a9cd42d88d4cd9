package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
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
}

func (f *validateFlags) BindFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.render.root, "root", ".", "directory that plays the source artifact's root; PATH is relative to it")
	fs.StringVarP(&f.render.deployment, "cluster-deployment", "f", "", "ClusterDeployment file whose path, substitutions and stages to use")
	fs.StringArrayVar(&f.render.substitute, "substitute", nil, "VAR=value for ${VAR} substitution (repeatable)")
	fs.StringVarP(&f.output, "output", "o", "text", "output format: text (one problem a line), json or yaml")
	fs.StringVar(&f.cluster.kubeconfig, "kubeconfig", "", "also check that the cluster of this kubeconfig serves every object's apiVersion and kind; without it (or --context) nothing reads a cluster")
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
runs the preflight checks of a validate stage over every object: the network
ConfigMap (label capstan.dev/config: network), Cluster API Clusters and Metal3
IPPools. It prints every problem, one per line, and exits non-zero when any
is an error; warnings alone pass. docs/validation.md lists the checks.

Without --kubeconfig or --context, validate is offline: it reads the files
under --root and nothing else. With them, it also looks every object up in
that cluster's API discovery, as a validate stage does before a plan applies
anything: a kind no CRD defines (install the provider first) or an apiVersion
the CRD does not serve is an error, a deprecated version a warning.`,
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
			where := filepath.Join(f.render.root, spec.Path)
			objs, err := render.Build(cmd.Context(), os.DirFS(f.render.root), opts)
			if err != nil {
				return fmt.Errorf("render %s: %w", where, err)
			}
			report := validateReport{Report: preflight.Validate(objs)}
			if f.online() {
				served, err := f.checkServed(cmd.Context(), spec, objs)
				if err != nil {
					return fmt.Errorf("validate %s: %w", where, err)
				}
				report.Served = served
			}
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

// servedCheck is what the served-API check looked up, and found.
type servedCheck struct {
	// Server is the API server the objects were looked up in.
	Server string `json:"server"`
	// Objects counts the objects looked up.
	Objects int `json:"objects"`
	// problems go into the report's Problems.
	problems []preflight.Problem
}

// validateReport is the preflight report, with the served-API check's
// problems when it ran; without it, it prints as preflight.Report alone.
type validateReport struct {
	preflight.Report
	Served *servedCheck `json:"served,omitempty"`
}

// all returns the report with the served-API problems after the network
// ones, as a validate stage reports them.
func (r validateReport) all() preflight.Report {
	all := r.Report
	if r.Served != nil {
		all.Problems = append(append([]preflight.Problem{}, r.Problems...), r.Served.problems...)
	}
	return all
}

// checkServed looks every object up in the cluster, in the order the
// deployment's plan would apply them, so that a CRD of the plan serves the
// objects after it; when the plan does not build, definitions come first.
func (f *validateFlags) checkServed(ctx context.Context, spec capstanv1.ClusterDeploymentSpec, objs []*unstructured.Unstructured) (*servedCheck, error) {
	cfg, err := f.cluster.restConfig()
	if err != nil {
		return nil, err
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = servedLookupTimeout
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", cfg.Host, err)
	}
	ordered := appliedOrder(spec, objs)
	served, err := stages.LookupServed(ctx, c, c.RESTMapper(), ordered)
	if err != nil {
		return nil, fmt.Errorf("look up the APIs %s serves: %w", cfg.Host, err)
	}
	return &servedCheck{Server: cfg.Host, Objects: len(ordered), problems: stages.CheckServed(ordered, served)}, nil
}

// appliedOrder returns the objects the deployment's plan applies, in its
// order, else all of them with Namespaces and CRDs first, as one apply
// stage would take them.
func appliedOrder(spec capstanv1.ClusterDeploymentSpec, objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	if specs, err := stages.StageSpecs(spec); err == nil {
		if plan, err := stages.BuildPlan(specs, objs); err == nil {
			return plan.AppliedObjects()
		}
	}
	one := &stages.Plan{Stages: []stages.Stage{{StageSpec: capstanv1.StageSpec{Name: "All", Action: capstanv1.StageActionApply}, Objects: objs}}}
	return one.AppliedObjects()
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
	if _, err := io.WriteString(w, served.Lines()); err != nil {
		return err
	}
	summary := served.Summary()
	if len(served.Problems) == 0 {
		summary = "no problems"
	}
	_, err := fmt.Fprintf(w, "%s in %s looked up in the API server %s\n", summary, plural(report.Served.Objects, "object"), report.Served.Server)
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
