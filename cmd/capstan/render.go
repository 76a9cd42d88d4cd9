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
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/render"
	"github.com/capstan-dev/capstan/stages"
)

// renderFlags select what to render and how to print it.
type renderFlags struct {
	root        string
	where       string // the overlay as the user named it, for messages
	deployment  string
	output      string
	substitute  []string
	showSecrets bool
	// decryptionKey is --decryption-key: sops files are decrypted only
	// with it (or $SOPS_AGE_KEY_FILE).
	decryptionKey string
}

func (f *renderFlags) BindFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.root, "root", "", rootFlagUsage)
	fs.StringVarP(&f.deployment, "cluster-deployment", "f", "", "ClusterDeployment file whose path, substitutions and stages to use")
	fs.StringVarP(&f.output, "output", "o", "yaml", "output format: yaml or json")
	fs.StringArrayVar(&f.substitute, "substitute", nil, "VAR=value for ${VAR} substitution (repeatable)")
	fs.BoolVar(&f.showSecrets, "show-secrets", false, "print the values of Secrets (and of decrypted documents); without it each value is replaced by "+maskedValue)
	f.bindDecryptionKey(fs)
}

func (f *renderFlags) bindDecryptionKey(fs *pflag.FlagSet) {
	fs.StringVar(&f.decryptionKey, "decryption-key", "", "decrypt sops-encrypted files with this key file: age identities (age-keygen's keys.txt), or an ASCII-armored OpenPGP private key if it ends in "+render.PGPKeySuffix+"; default $"+sopsAgeKeyFileEnv+"; without either, files are rendered as they are in git")
}

// sopsAgeKeyFileEnv is the variable sops itself reads the age key file from.
const sopsAgeKeyFileEnv = "SOPS_AGE_KEY_FILE"

// keys reads --decryption-key (or $SOPS_AGE_KEY_FILE); nil without either,
// which leaves sops files encrypted.
func (f *renderFlags) keys() (*render.Keys, error) {
	file := f.decryptionKey
	if file == "" {
		file = os.Getenv(sopsAgeKeyFileEnv)
	}
	if file == "" {
		return nil, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--decryption-key: %w", err)
	}
	name := file
	if !strings.HasSuffix(file, render.PGPKeySuffix) {
		name = file + render.AgeKeySuffix
	}
	keys, err := render.ParseKeys(map[string][]byte{name: data})
	if err != nil {
		return nil, fmt.Errorf("--decryption-key: %w", err)
	}
	return keys, nil
}

func newRenderCommand() *cobra.Command {
	var f renderFlags
	cmd := &cobra.Command{
		Use:   "render [PATH]",
		Short: "Print the objects a path renders to, grouped by stage",
		Long: `Render builds a kustomize overlay the way the daemon does (no plugins, no
network, nothing outside --root) and prints its objects grouped by the stage
that applies them. With -f, the path, substitutions and stages come from a
ClusterDeployment file. The values of Secrets are masked unless
--show-secrets.`,
		Example: `  capstan render --root examples clusters/mgmt
  capstan render --root examples -f examples/clusters/mgmt/clusterdeployment.yaml`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec, err := f.spec(args)
			if err != nil {
				return err
			}
			opts := render.DefaultOptions()
			opts.Path = spec.Path
			opts.Substitute = spec.Substitute
			if opts.Decrypt, err = f.keys(); err != nil {
				return err
			}
			objs, err := render.Build(cmd.Context(), os.DirFS(f.root), opts)
			if err != nil {
				return fmt.Errorf("render %s: %w", f.where, err)
			}
			specs, err := stages.StageSpecs(spec)
			if err != nil {
				return err
			}
			plan, err := stages.BuildPlan(specs, objs)
			if err != nil {
				return fmt.Errorf("plan: %w", err)
			}
			if !f.showSecrets {
				maskSecrets(plan)
			}
			return printPlan(cmd.OutOrStdout(), plan, f.output)
		},
	}
	f.BindFlags(cmd.Flags())
	return cmd
}

// spec is the spec to render: -f's, PATH and --substitute applied, and
// a placeholder bootstrap key when the plan needs one and none is given.
func (f *renderFlags) spec(args []string) (capstanv1.ClusterDeploymentSpec, error) {
	spec, err := f.givenSpec(args)
	if err != nil {
		return spec, err
	}
	return spec, bootstrapKeyPlaceholder(&spec)
}

// givenSpec is -f's spec with PATH and --substitute applied.
func (f *renderFlags) givenSpec(args []string) (capstanv1.ClusterDeploymentSpec, error) {
	var spec capstanv1.ClusterDeploymentSpec
	if f.deployment != "" {
		data, err := os.ReadFile(f.deployment)
		if err != nil {
			return spec, err
		}
		var cd capstanv1.ClusterDeployment
		if err := yaml.UnmarshalStrict(data, &cd); err != nil {
			return spec, fmt.Errorf("%s: %w", f.deployment, err)
		}
		if cd.Kind != capstanv1.ClusterDeploymentKind {
			return spec, fmt.Errorf("%s: kind is %q, expected %s", f.deployment, cd.Kind, capstanv1.ClusterDeploymentKind)
		}
		spec = cd.Spec
	}
	if len(args) == 1 {
		if err := f.locate(&spec, args[0]); err != nil {
			return spec, err
		}
	}
	if spec.Path == "" {
		return spec, fmt.Errorf("no path to render: give PATH or -f with spec.path")
	}
	if f.root == "" {
		f.root = "." // -f's spec.path is relative to the artifact root, as in the daemon
	}
	if f.where == "" {
		f.where = filepath.Join(f.root, spec.Path)
	}
	for _, kv := range f.substitute {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return spec, fmt.Errorf("--substitute %q: expected VAR=value", kv)
		}
		if spec.Substitute == nil {
			spec.Substitute = map[string]string{}
		}
		spec.Substitute[k] = v
	}
	return spec, nil
}

// locate sets spec.Path, f.root and f.where from PATH as typed.
func (f *renderFlags) locate(spec *capstanv1.ClusterDeploymentSpec, path string) error {
	rootGiven := f.root != ""
	o, err := locateOverlay(f.root, path)
	if err != nil {
		return err
	}
	f.root, spec.Path = o.root, o.path
	if rootGiven {
		f.where = filepath.Join(f.root, spec.Path)
	} else {
		f.where = path
	}
	return nil
}

type renderedStage struct {
	Name    string           `json:"name"`
	Action  string           `json:"action"`
	Objects []map[string]any `json:"objects"`
}

func printPlan(w io.Writer, plan *stages.Plan, format string) error {
	switch format {
	case "json":
		out := make([]renderedStage, len(plan.Stages))
		for i, s := range plan.Stages {
			out[i] = renderedStage{Name: s.Name, Action: string(s.Action)}
			for _, o := range s.Objects {
				out[i].Objects = append(out[i].Objects, o.Object)
			}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	case "yaml":
		for _, s := range plan.Stages {
			fmt.Fprintf(w, "# stage %s (%s, %s)\n", s.Name, s.Action, plural(len(s.Objects), "object"))
			for _, o := range s.Objects {
				data, err := yaml.Marshal(o.Object)
				if err != nil {
					return err
				}
				fmt.Fprintf(w, "---\n%s", data)
			}
		}
		return nil
	default:
		return fmt.Errorf("--output %q: expected yaml or json", format)
	}
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// maskedValue replaces each value of a Secret that render prints.
const maskedValue = "*** (masked; --show-secrets prints it)"

// maskSecrets replaces the values of the plan's Secrets (data and
// stringData) by maskedValue, keeping their keys.
func maskSecrets(plan *stages.Plan) {
	for i := range plan.Stages {
		for j, obj := range plan.Stages[i].Objects {
			if render.IsDecrypted(obj.GetAnnotations()) && (obj.GetKind() != "Secret" || obj.GroupVersionKind().Group != "") {
				plan.Stages[i].Objects[j] = maskDecrypted(obj)
				continue
			}
			if obj.GetKind() != "Secret" || obj.GroupVersionKind().Group != "" {
				continue
			}
			obj = obj.DeepCopy()
			for _, field := range []string{"data", "stringData"} {
				values, ok := obj.Object[field].(map[string]any)
				if !ok {
					continue
				}
				for k := range values {
					values[k] = maskedValue
				}
			}
			plan.Stages[i].Objects[j] = obj
		}
	}
}

// maskDecrypted returns a copy of a document decrypted from a sops file
// with every string outside its metadata masked: which of them sops
// encrypted is not known after decryption.
func maskDecrypted(obj *unstructured.Unstructured) *unstructured.Unstructured {
	obj = obj.DeepCopy()
	var mask func(v any) any
	mask = func(v any) any {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				v[k] = mask(e)
			}
		case []any:
			for i, e := range v {
				v[i] = mask(e)
			}
		case string:
			return maskedValue
		}
		return v
	}
	for k, v := range obj.Object {
		if k != "metadata" && k != "apiVersion" && k != "kind" {
			obj.Object[k] = mask(v)
		}
	}
	return obj
}
