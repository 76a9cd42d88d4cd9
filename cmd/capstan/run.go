package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/sources/dir"
	"github.com/capstan-dev/capstan/sources/git"
)

// clusterFlags say how to reach the cluster.
type clusterFlags struct {
	kubeconfig string
	context    string
}

func (f *clusterFlags) BindFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, in-cluster config, ~/.kube/config)")
	fs.StringVar(&f.context, "context", "", "kubeconfig context to use")
}

func (f *clusterFlags) restConfig() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: f.context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load cluster config: %w (set --kubeconfig or KUBECONFIG)", err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	cfg.UserAgent = "capstan/" + versionString()
	return cfg, nil
}

// rootFlags name the root source.
type rootFlags struct {
	url, branch, path, namespace string
	dir                          string
	interval                     time.Duration
	username                     string
	sshKeyFile, knownHostsFile   string
}

func (f *rootFlags) BindFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.url, "source", "", "git URL of the root source; every ClusterDeployment under --path is applied and reconciled")
	fs.StringVar(&f.dir, "dir", "", "local directory as the root source instead of --source: every change under it is applied within a second (fsnotify)")
	fs.StringVar(&f.branch, "branch", "main", "branch of the root source")
	fs.StringVar(&f.path, "path", "clusters", "path in the root source holding ClusterDeployment files")
	fs.StringVar(&f.namespace, "namespace", "capstan-system", "namespace for root ClusterDeployments that set none")
	fs.DurationVar(&f.interval, "interval", time.Minute, "how often the root source is polled")
	fs.StringVar(&f.username, "source-username", "", "user for https; the password or token is read from $CAPSTAN_SOURCE_PASSWORD")
	fs.StringVar(&f.sshKeyFile, "source-ssh-key-file", "", "private key file for an ssh root source")
	fs.StringVar(&f.knownHostsFile, "source-known-hosts-file", "", "known_hosts file for an ssh root source")
}

func (f *rootFlags) options() (*reconciler.RootOptions, error) {
	if f.dir != "" {
		if f.url != "" {
			return nil, fmt.Errorf("--dir and --source both name a root source; give one")
		}
		src, err := dir.New(dir.Options{Path: f.dir})
		if err != nil {
			return nil, fmt.Errorf("--dir: %w", err)
		}
		return &reconciler.RootOptions{
			URL: "dir://" + src.Path(), Path: f.path, Namespace: f.namespace,
			Interval: f.interval, Source: src,
		}, nil
	}
	if f.url == "" {
		return nil, nil
	}
	auth := git.Auth{Username: f.username, Password: os.Getenv("CAPSTAN_SOURCE_PASSWORD")}
	var err error
	if f.sshKeyFile != "" {
		if auth.SSHPrivateKey, err = os.ReadFile(f.sshKeyFile); err != nil {
			return nil, fmt.Errorf("--source-ssh-key-file: %w", err)
		}
	}
	if f.knownHostsFile != "" {
		if auth.SSHKnownHosts, err = os.ReadFile(f.knownHostsFile); err != nil {
			return nil, fmt.Errorf("--source-known-hosts-file: %w", err)
		}
	}
	return &reconciler.RootOptions{
		URL: f.url, Branch: f.branch, Path: f.path, Namespace: f.namespace,
		Interval: f.interval, Auth: auth,
	}, nil
}

// daemonFlags tune the daemon.
type daemonFlags struct {
	metricsAddr, healthAddr string
	workers, concurrency    int
	waitSlice               time.Duration
	logFormat               string
	webhookAddr             string
	leader                  reconciler.LeaderElectionOptions
	mirrorInterval          time.Duration
	clusterName             string
}

func (f *daemonFlags) BindFlags(fs *pflag.FlagSet) {
	d := reconciler.DefaultOptions()
	fs.StringVar(&f.metricsAddr, "metrics-addr", d.MetricsAddr, `address of the Prometheus metrics endpoint; "0" disables it`)
	fs.StringVar(&f.healthAddr, "health-addr", d.HealthAddr, `address of /healthz and /readyz; "0" disables it`)
	fs.IntVar(&f.workers, "workers", d.Workers, "ClusterDeployments reconciled at once")
	fs.IntVar(&f.concurrency, "apply-concurrency", d.ApplyConcurrency, "objects of one stage applied in parallel")
	fs.DurationVar(&f.waitSlice, "wait-slice", d.Reconciler.WaitSlice, "how long one attempt waits for a stage before it records progress")
	fs.StringVar(&f.logFormat, "log-format", "json", "log format: json or text")
	fs.BoolVar(&f.leader.Enabled, "leader-elect", d.LeaderElection.Enabled, "elect a leader through a Lease, so that of several replicas only one acts")
	fs.StringVar(&f.leader.Namespace, "leader-election-namespace", "", "namespace of the leader Lease (default: the pod's namespace, else capstan-system)")
	fs.StringVar(&f.leader.ID, "leader-election-id", d.LeaderElection.ID, "name of the leader Lease")
	fs.DurationVar(&f.leader.LeaseDuration, "leader-election-lease-duration", d.LeaderElection.LeaseDuration, "how long a standby waits after the leader's last renewal before it takes over")
	fs.DurationVar(&f.leader.RenewDeadline, "leader-election-renew-deadline", d.LeaderElection.RenewDeadline, "how long the leader tries to renew before it stops acting and exits")
	fs.DurationVar(&f.leader.RetryPeriod, "leader-election-retry-period", d.LeaderElection.RetryPeriod, "how often candidates try to take or renew the Lease")
	fs.DurationVar(&f.mirrorInterval, "mirror-interval", d.Reconciler.MirrorInterval, "how often the mirrors a pivot leaves in this cluster take the status of the deployment, Clusters and Machines in the target")
	fs.StringVar(&f.clusterName, "cluster-name", "", `this cluster's name, for people: in fencing records and on deployments it moves (default "cluster <id>")`)
	fs.StringVar(&f.webhookAddr, "webhook-addr", "", `address of the push receiver (POST /hook/github|gitlab|gitea|generic), e.g. ":9292"; secrets come from $CAPSTAN_WEBHOOK_GITHUB_SECRET, $CAPSTAN_WEBHOOK_GITLAB_TOKEN, $CAPSTAN_WEBHOOK_GITEA_SECRET, $CAPSTAN_WEBHOOK_TOKEN`)
}

func newRunCommand() *cobra.Command {
	var cluster clusterFlags
	var root rootFlags
	var daemon daemonFlags
	var self selfInstallFlags
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the daemon: reconcile every ClusterDeployment, and those committed under the root source",
		Example: `  # adding a cluster is a git push: every ClusterDeployment under clusters/ is managed
  capstan run --source https://git.example/infra.git --branch main --path clusters/`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			setLogger(daemon.logFormat)
			cfg, err := cluster.restConfig()
			if err != nil {
				return err
			}
			rootOpts, err := root.options()
			if err != nil {
				return err
			}
			opts := reconciler.DefaultOptions()
			opts.Config = cfg
			opts.Root = rootOpts
			opts.MetricsAddr, opts.HealthAddr = daemon.metricsAddr, daemon.healthAddr
			opts.Workers, opts.ApplyConcurrency = daemon.workers, daemon.concurrency
			opts.Reconciler.WaitSlice = daemon.waitSlice
			opts.Webhook = daemon.webhook()
			opts.LeaderElection = daemon.leader
			opts.Reconciler.MirrorInterval = daemon.mirrorInterval
			opts.ClusterName = daemon.clusterName
			if i := self.installer(root); i != nil {
				opts.Installer = i
			}
			d, err := reconciler.New(opts)
			if err != nil {
				return err
			}
			return d.Run(cmd.Context())
		},
	}
	cluster.BindFlags(cmd.Flags())
	root.BindFlags(cmd.Flags())
	daemon.BindFlags(cmd.Flags())
	self.BindFlags(cmd.Flags())
	return cmd
}

func setLogger(format string) {
	var h slog.Handler
	if format == "text" {
		h = slog.NewTextHandler(os.Stderr, nil)
	} else {
		h = slog.NewJSONHandler(os.Stderr, nil)
	}
	ctrl.SetLogger(logr.FromSlogHandler(h))
}

// webhook returns the push receiver's options, with secrets from the
// environment so that they never show in a process listing.
func (f *daemonFlags) webhook() *reconciler.WebhookOptions {
	if f.webhookAddr == "" {
		return nil
	}
	return &reconciler.WebhookOptions{
		Addr:         f.webhookAddr,
		GitHubSecret: []byte(os.Getenv("CAPSTAN_WEBHOOK_GITHUB_SECRET")),
		GitLabToken:  []byte(os.Getenv("CAPSTAN_WEBHOOK_GITLAB_TOKEN")),
		GiteaSecret:  []byte(os.Getenv("CAPSTAN_WEBHOOK_GITEA_SECRET")),
		GenericToken: []byte(os.Getenv("CAPSTAN_WEBHOOK_TOKEN")),
	}
}
