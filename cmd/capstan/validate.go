package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	"github.com/capstan-dev/capstan/render"
	"github.com/capstan-dev/capstan/stages/preflight"
)

// validateFlags select what to render, as for render, and how to print
// the report.
type validateFlags struct {
	render renderFlags
	output string
}

func (f *validateFlags) BindFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.render.root, "root", ".", "directory that plays the source artifact's root; PATH is relative to it")
	fs.StringVarP(&f.render.deployment, "cluster-deployment", "f", "", "ClusterDeployment file whose path and substitutions to use")
	fs.StringArrayVar(&f.render.substitute, "substitute", nil, "VAR=value for ${VAR} substitution (repeatable)")
	fs.StringVarP(&f.output, "output", "o", "text", "output format: text (one problem a line), json or yaml")
}

func newValidateCommand() *cobra.Command {
	var f validateFlags
	cmd := &cobra.Command{
		Use:   "validate [PATH]",
		Short: "Check the network settings a path renders to, before anything is applied",
		Long: `Validate renders a kustomize overlay the way render and the daemon do and
runs the preflight checks of a validate stage over every object: the network
ConfigMap (label capstan.dev/config: network), Cluster API Clusters and Metal3
IPPools. It prints every problem, one per line, and exits non-zero when any
is an error; warnings alone pass. docs/validation.md lists the checks.`,
		Example: `  capstan validate --root clusters edge-01
  capstan validate --root . -f clusters/edge-01/clusterdeployment.yaml -o json`,
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
			objs, err := render.Build(cmd.Context(), os.DirFS(f.render.root), opts)
			if err != nil {
				return fmt.Errorf("render %s: %w", filepath.Join(f.render.root, spec.Path), err)
			}
			report := preflight.Validate(objs)
			if err := printReport(cmd.OutOrStdout(), report, len(objs), f.output); err != nil {
				return err
			}
			if report.Err() != nil {
				return fmt.Errorf("validate %s: preflight found %s", filepath.Join(f.render.root, spec.Path), report.Summary())
			}
			return nil
		},
	}
	f.BindFlags(cmd.Flags())
	return cmd
}

// printReport prints the report: one line per problem and a summary as
// text, or the Report itself as JSON or YAML.
func printReport(w io.Writer, report preflight.Report, objects int, format string) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(report)
	case "yaml":
		data, err := yaml.Marshal(report)
		if err != nil {
			return err
		}
		_, err = w.Write(data)
		return err
	}
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
