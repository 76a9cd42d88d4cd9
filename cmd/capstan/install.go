package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/yaml"

	"github.com/capstan-dev/capstan/manifests"
)

// installFlags say what to install: they map onto manifests.Options.
type installFlags struct {
	opts    manifests.Options
	patches []string
	timeout time.Duration
	export  bool
}

func (f *installFlags) BindFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.opts.Image, "image", "", "image of the daemon (default: the release's image named in manifests/kustomization.yaml)")
	fs.StringVarP(&f.opts.Namespace, "namespace", "n", manifests.Namespace, "namespace of the daemon, its ServiceAccount and its leader Lease")
	fs.StringVar(&f.opts.Source.URL, "source", "", "git URL of the root source: every ClusterDeployment under --path is applied and reconciled (default: none)")
	fs.StringVar(&f.opts.Source.Branch, "branch", "", "branch of the root source (default main)")
	fs.StringVar(&f.opts.Source.Path, "path", "", "path in the root source holding ClusterDeployment files (default clusters)")
	fs.StringVar(&f.opts.Source.Interval, "interval", "", "how often the root source is polled (default 1m)")
	fs.StringVar(&f.opts.Source.Username, "source-username", "", "user for an https root source; put the password in Secret capstan-secrets, key CAPSTAN_SOURCE_PASSWORD")
	fs.Int32Var(&f.opts.Replicas, "replicas", 1, "replicas of the daemon; all but the leader stand by")
	fs.BoolVar(&f.opts.HostNetwork, "host-network", false, "run in the node's network and tolerate not-ready nodes (a cluster without a CNI yet)")
	fs.StringVar(&f.opts.APIServer, "api-server", "", `"host:port" the pods reach the API server at, when the kubernetes Service does not work yet (no kube-proxy)`)
	fs.IntVar(&f.opts.MetricsPort, "metrics-port", 0, "container port of /metrics (default 8080)")
	fs.IntVar(&f.opts.HealthPort, "health-port", 0, "container port of /healthz and /readyz (default 8081)")
	fs.BoolVar(&f.opts.Tenancy, "tenancy", false, "the multi-tenant install (docs/tenancy.md): deployments that name no ServiceAccount act as capstan-deployer of their namespace, and Capstan reads Secrets and impersonates only in the namespaces bound to its role capstan-namespace")
	fs.StringArrayVar(&f.patches, "patch", nil, "file with a strategic-merge patch of one of the installed objects (names its kind and metadata.name); repeatable")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Minute, "how long to wait for the daemon to be ready")
	fs.BoolVar(&f.export, "export", false, "print the manifests as YAML instead of applying them (to commit them, or to apply them with kubectl)")
}

// objects renders the manifests the flags ask for.
func (f *installFlags) objects() ([]*unstructured.Unstructured, error) {
	opts, err := f.options()
	if err != nil {
		return nil, err
	}
	return manifests.Objects(opts)
}

// leftovers renders what an install of the other kind (plain or
// multi-tenant) holds and this one does not.
func (f *installFlags) leftovers() ([]*unstructured.Unstructured, error) {
	opts, err := f.options()
	if err != nil {
		return nil, err
	}
	return manifests.Leftovers(opts)
}

func (f *installFlags) options() (manifests.Options, error) {
	opts := f.opts
	for _, p := range f.patches {
		data, err := os.ReadFile(p)
		if err != nil {
			return opts, fmt.Errorf("--patch: %w", err)
		}
		opts.Patches = append(opts.Patches, types.Patch{Patch: string(data)})
	}
	return opts, nil
}

func newInstallCommand() *cobra.Command {
	var cluster clusterFlags
	var f installFlags
	cmd := &cobra.Command{
		Use:   "install",
		Short: "Install Capstan into a cluster and wait until its daemon runs",
		Long: `Install applies Capstan's CRDs, namespace, RBAC and Deployment (the files of
manifests/, embedded in this binary) with server-side apply, then waits until
the Deployment is available and a replica holds the leader Lease. Running it
again changes only what the flags change. --export prints the manifests
instead, for kubectl or for a repository.`,
		Example: `  # the daemon follows clusters/ on branch main of a repository
  capstan install --source https://git.example/infra.git --path clusters

  # a cluster whose network add-on is not installed yet
  capstan install --host-network --api-server 10.0.0.10:6443

  # teams create ClusterDeployments in their own namespaces
  # (docs/tenancy.md: what to bind in each one)
  capstan install --tenancy --source https://git.example/infra.git

  capstan install --export > capstan.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			objs, err := f.objects()
			if err != nil {
				return err
			}
			if f.export {
				return writeYAML(cmd.OutOrStdout(), objs)
			}
			leftovers, err := f.leftovers()
			if err != nil {
				return err
			}
			c, err := cluster.client()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
			defer cancel()
			return install(ctx, c, objs, leftovers, cmd.OutOrStdout())
		},
	}
	cluster.BindFlags(cmd.Flags())
	f.BindFlags(cmd.Flags())
	return cmd
}

// install applies objs, deletes leftovers (the RBAC of an install of the
// other kind: switching to --tenancy takes the cluster-wide bindings
// away) and waits for the daemon.
func install(ctx context.Context, c client.Client, objs, leftovers []*unstructured.Unstructured, out io.Writer) error {
	begin := time.Now()
	in := manifests.NewInstaller(c, out)
	if _, err := in.Apply(ctx, objs); err != nil {
		return err
	}
	if err := in.Remove(ctx, leftovers); err != nil {
		return err
	}
	if err := in.Wait(ctx, objs); err != nil {
		return fmt.Errorf("%w\n(the objects are applied; `kubectl -n %s describe pods` and `kubectl -n %s logs deploy/capstan` say more)",
			err, namespaceOf(objs), namespaceOf(objs))
	}
	fmt.Fprintf(out, "installed in %s\n", time.Since(begin).Round(100*time.Millisecond))
	return nil
}

func newUninstallCommand() *cobra.Command {
	var cluster clusterFlags
	var f installFlags
	var opts manifests.UninstallOptions
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "Remove Capstan from a cluster",
		Long: `Uninstall stops the daemon, then deletes its RBAC, namespace and CRDs and waits
until they are gone. It refuses while ClusterDeployments or LCM objects exist,
unless --force (they are deleted with the CRDs; the objects they applied stay)
or --keep-crds (they stay for a later install).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			objs, err := f.objects()
			if err != nil {
				return err
			}
			// Whichever kind of install it was, its RBAC goes.
			leftovers, err := f.leftovers()
			if err != nil {
				return err
			}
			objs = append(objs, leftovers...)
			c, err := cluster.client()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
			defer cancel()
			if err := manifests.NewInstaller(c, cmd.OutOrStdout()).Uninstall(ctx, objs, opts); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "uninstalled")
			return nil
		},
	}
	cluster.BindFlags(cmd.Flags())
	cmd.Flags().StringVarP(&f.opts.Namespace, "namespace", "n", manifests.Namespace, "namespace Capstan was installed in")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 5*time.Minute, "how long to wait for everything to be gone")
	cmd.Flags().BoolVar(&opts.Force, "force", false, "uninstall even while ClusterDeployments or LCM objects exist (they go with the CRDs)")
	cmd.Flags().BoolVar(&opts.KeepCRDs, "keep-crds", false, "keep the CRDs and every ClusterDeployment and LCM object")
	return cmd
}

func writeYAML(w io.Writer, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		data, err := yaml.Marshal(o.Object)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "---\n%s", data); err != nil {
			return err
		}
	}
	return nil
}

func namespaceOf(objs []*unstructured.Unstructured) string {
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			return o.GetNamespace()
		}
	}
	return manifests.Namespace
}
