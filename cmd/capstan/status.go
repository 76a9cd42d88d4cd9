package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler"
)

// defaultNamespace is where `capstan run` puts root ClusterDeployments; the
// CLI reads it when neither -n nor the kubeconfig context names one.
const defaultNamespace = "capstan-system"

// scopeFlags select the namespace a command reads.
type scopeFlags struct {
	namespace     string
	allNamespaces bool
}

func (f *scopeFlags) BindFlags(fs *pflag.FlagSet, all bool) {
	fs.StringVarP(&f.namespace, "namespace", "n", "", "namespace (default: the kubeconfig context's, else "+defaultNamespace+")")
	if all {
		fs.BoolVarP(&f.allNamespaces, "all-namespaces", "A", false, "every namespace")
	}
}

// resolve returns the namespace to read; "" means all.
func (f *scopeFlags) resolve(cluster *clusterFlags) (string, error) {
	switch {
	case f.allNamespaces && f.namespace != "":
		return "", errors.New("--namespace and --all-namespaces exclude each other")
	case f.allNamespaces:
		return "", nil
	case f.namespace != "":
		return f.namespace, nil
	}
	return cluster.contextNamespace(), nil
}

// contextNamespace is the namespace the kubeconfig context sets, else
// defaultNamespace. kubectl's fallback, "default", rarely holds deployments.
func (f *clusterFlags) contextNamespace() string {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	raw, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: f.context}).RawConfig()
	if err == nil {
		name := f.context
		if name == "" {
			name = raw.CurrentContext
		}
		if c, ok := raw.Contexts[name]; ok && c.Namespace != "" {
			return c.Namespace
		}
	}
	return defaultNamespace
}

func (f *clusterFlags) client() (client.WithWatch, error) {
	cfg, err := f.restConfig()
	if err != nil {
		return nil, err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		return nil, fmt.Errorf("create client: %w", err)
	}
	return c, nil
}

// statusFlags are the flags of `capstan status`.
type statusFlags struct {
	scope scopeFlags
	watch bool
	out   outputFlags
}

func (f *statusFlags) BindFlags(fs *pflag.FlagSet) {
	f.scope.BindFlags(fs, true)
	fs.BoolVarP(&f.watch, "watch", "w", false, "redraw whenever a ClusterDeployment changes, until interrupted")
	f.out.BindFlags(fs, "full revisions, objects per stage, whole messages wrapped")
}

func newStatusCommand() *cobra.Command {
	var cluster clusterFlags
	var f statusFlags
	cmd := &cobra.Command{
		Use:   "status [CLUSTER]",
		Short: "Show the stages of ClusterDeployments: a progress bar and a table per deployment",
		Long: `Status reads ClusterDeployments from the cluster and prints, for each, its
state, revision, a progress bar of stages Ready (with how far the current
stage is: objects ready, machines rolled out) and a table of its stages
(state, progress, age, attempts and what the stage waits for). A failure
before the first stage (source, render, preflight) is shown alone, every
line of it: the stages in status are then an earlier revision's.

Every line fits the terminal's width (80 columns when stdout is not a
terminal, unless $COLUMNS or --width say otherwise); messages are cut to
it, or wrapped whole with -o wide. Colour only on a terminal (never with
NO_COLOR set). With --watch it redraws whenever a ClusterDeployment
changes.`,
		Example: `  capstan status -A
  capstan status mgmt-east -n capstan-system --watch
  capstan status mgmt-east -o wide --width 120
  capstan status mgmt-east -o json | jq '.[0].stages[] | select(.stuck)'`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.out.validate(); err != nil {
				return err
			}
			ns, err := f.scope.resolve(&cluster)
			if err != nil {
				return err
			}
			if len(args) == 1 && ns == "" {
				return errors.New("CLUSTER needs a namespace: use -n, not -A")
			}
			c, err := cluster.client()
			if err != nil {
				return err
			}
			s := &statusCommand{client: c, namespace: ns, out: cmd.OutOrStdout()}
			if f.out.structured() {
				s.output = f.out.output
			}
			if len(args) == 1 {
				s.name = args[0]
			}
			s.flags = f.out
			if f.watch {
				return s.watch(cmd.Context())
			}
			return s.once(cmd.Context())
		},
	}
	cluster.BindFlags(cmd.Flags())
	f.BindFlags(cmd.Flags())
	return cmd
}

type statusCommand struct {
	client    client.WithWatch
	namespace string // "" for all namespaces
	name      string // "" for every deployment
	output    string // yaml or json; "" draws tables
	out       io.Writer
	// flags say how to draw; read at each frame, so that a watch follows
	// a terminal that is resized.
	flags outputFlags
}

func (s *statusCommand) listOptions() []client.ListOption {
	var opts []client.ListOption
	if s.namespace != "" {
		opts = append(opts, client.InNamespace(s.namespace))
	}
	if s.name != "" {
		opts = append(opts, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", s.name)})
	}
	return opts
}

func (s *statusCommand) where() string {
	switch {
	case s.name != "":
		return fmt.Sprintf("named %s in namespace %s", s.name, s.namespace)
	case s.namespace == "":
		return "in any namespace"
	default:
		return "in namespace " + s.namespace
	}
}

func (s *statusCommand) once(ctx context.Context) error {
	list := &capstanv1.ClusterDeploymentList{}
	if err := s.client.List(ctx, list, s.listOptions()...); err != nil {
		return fmt.Errorf("list ClusterDeployments %s: %w", s.where(), err)
	}
	if s.name != "" && len(list.Items) == 0 {
		return fmt.Errorf("ClusterDeployment %s/%s not found", s.namespace, s.name)
	}
	_, err := io.WriteString(s.out, s.render(list.Items))
	return err
}

// render draws the deployments in the chosen format.
func (s *statusCommand) render(items []capstanv1.ClusterDeployment) string {
	sortDeployments(items)
	if s.output != "" {
		data, err := encode(summarize(items), s.output)
		if err != nil {
			return fmt.Sprintf("encode: %v\n", err)
		}
		return string(data)
	}
	v := s.flags.view(s.out)
	v.now = time.Now()
	return v.renderFrame(items, s.where())
}

// clearScreen moves the cursor home and clears the terminal, for a redraw.
const clearScreen = "\x1b[H\x1b[2J"

// watch lists the deployments, then follows a watch on them and redraws
// whenever what it would print changes. A watch that ends (the server's
// timeout, a resource version too old) is started again from a new list.
func (s *statusCommand) watch(ctx context.Context) error {
	last := ""
	draw := func(items map[string]capstanv1.ClusterDeployment) error {
		list := make([]capstanv1.ClusterDeployment, 0, len(items))
		for _, cd := range items {
			list = append(list, cd)
		}
		frame := s.render(list)
		if frame == last {
			return nil
		}
		last = frame
		if isTerminal(s.out) && s.output == "" {
			frame = clearScreen + frame
		} else if s.output == "" {
			frame += "\n"
		}
		_, err := io.WriteString(s.out, frame)
		return err
	}
	for ctx.Err() == nil {
		list := &capstanv1.ClusterDeploymentList{}
		if err := s.client.List(ctx, list, s.listOptions()...); err != nil {
			if ctx.Err() != nil {
				break
			}
			return fmt.Errorf("list ClusterDeployments %s: %w", s.where(), err)
		}
		items := map[string]capstanv1.ClusterDeployment{}
		for _, cd := range list.Items {
			items[cd.Namespace+"/"+cd.Name] = cd
		}
		if err := draw(items); err != nil {
			return err
		}
		opts := append(s.listOptions(), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
		w, err := s.client.Watch(ctx, &capstanv1.ClusterDeploymentList{}, opts...)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return fmt.Errorf("watch ClusterDeployments %s: %w", s.where(), err)
		}
		began := time.Now()
		if err := s.follow(ctx, w, items, draw); err != nil {
			return err
		}
		// A watch that keeps failing at once must not turn into a hot loop.
		if time.Since(began) < time.Second {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

// follow applies watch events to items and redraws, until the watch or ctx
// ends.
func (s *statusCommand) follow(ctx context.Context, w watch.Interface, items map[string]capstanv1.ClusterDeployment, draw func(map[string]capstanv1.ClusterDeployment) error) error {
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil
			}
			switch ev.Type {
			case watch.Error:
				// Most often 410 Gone (the resource version is too old):
				// list again.
				return nil
			case watch.Added, watch.Modified, watch.Deleted:
				cd, isCD := ev.Object.(*capstanv1.ClusterDeployment)
				if !isCD {
					continue
				}
				key := cd.Namespace + "/" + cd.Name
				if ev.Type == watch.Deleted {
					delete(items, key)
				} else {
					items[key] = *cd
				}
				if err := draw(items); err != nil {
					return err
				}
			}
		}
	}
}

// deploymentSummary is what -o json|yaml prints per deployment.
type deploymentSummary struct {
	Namespace    string `json:"namespace"`
	Name         string `json:"name"`
	Phase        string `json:"phase"`
	Revision     string `json:"revision,omitempty"`
	StagesReady  int    `json:"stagesReady"`
	StagesTotal  int    `json:"stagesTotal"`
	CurrentStage string `json:"currentStage,omitempty"`
	Message      string `json:"message,omitempty"`
	// StagesStale is set when a failure before the first stage stopped
	// the revision: Stages are then an earlier walk's, and not counted.
	StagesStale bool                    `json:"stagesStale,omitempty"`
	Stages      []capstanv1.StageStatus `json:"stages"`
}

func summarize(items []capstanv1.ClusterDeployment) []deploymentSummary {
	out := make([]deploymentSummary, len(items))
	for i := range items {
		cd := &items[i]
		p := phase(cd)
		out[i] = deploymentSummary{
			Namespace: cd.Namespace, Name: cd.Name, Phase: p, Revision: cd.Status.Revision,
			Message: reasonLine(cd, p), Stages: cd.Status.Stages,
		}
		if cd.Status.StagesCurrent() {
			out[i].StagesReady, out[i].StagesTotal = cd.Status.StagesReady(), len(cd.Status.Stages)
			out[i].CurrentStage = cd.Status.CurrentStage
		} else {
			out[i].StagesStale = true
		}
		if out[i].Stages == nil {
			out[i].Stages = []capstanv1.StageStatus{}
		}
	}
	return out
}
