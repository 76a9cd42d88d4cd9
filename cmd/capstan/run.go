package main

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/sources"
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
	// No client-side rate limit: the API server's priority and fairness
	// decides how fast Capstan may go (a 429 with Retry-After is waited
	// out by client-go), and the executor bounds what it has in flight.
	cfg.QPS, cfg.Burst = -1, -1
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
	caFile                       string
	namespaces                   []string
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
	fs.StringSliceVar(&f.namespaces, "root-source-namespaces", nil, "namespaces, besides Capstan's own and --namespace, whose ClusterDeployments without spec.source read the root source (comma-separated); a deployment without spec.source elsewhere stalls (docs/root-source.md)")
	fs.StringVar(&f.caFile, "source-ca-file", "", "PEM file of the CAs to trust for an https root source, on top of the system roots (a private CA); else the PEM in $CAPSTAN_SOURCE_CA")
}

// sourceCAEnv holds the PEM of the root source's CAs when no
// --source-ca-file is given.
const sourceCAEnv = "CAPSTAN_SOURCE_CA"

func (f *rootFlags) options(limits reconciler.ArtifactOptions) (*reconciler.RootOptions, error) {
	for _, ns := range f.namespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, fmt.Errorf("--root-source-namespaces: %q is not a namespace name: %s", ns, strings.Join(errs, "; "))
		}
	}
	if len(f.namespaces) > 0 && f.dir == "" && f.url == "" {
		return nil, fmt.Errorf("--root-source-namespaces is set but there is no root source: give --source or --dir")
	}
	if f.dir != "" {
		if f.url != "" {
			return nil, fmt.Errorf("--dir and --source both name a root source; give one")
		}
		// A local directory is read into memory (it is hashed on every
		// poll), within the artifact limits.
		src, err := dir.New(dir.Options{Path: f.dir, Limits: sources.Limits{
			MaxFileBytes: limits.MaxFileBytes, MaxTotalBytes: limits.MaxArtifactBytes}})
		if err != nil {
			return nil, fmt.Errorf("--dir: %w", err)
		}
		return &reconciler.RootOptions{
			URL: "dir://" + src.Path(), Path: f.path, Namespace: f.namespace, Namespaces: f.namespaces,
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
	caFrom := "--source-ca-file " + f.caFile
	if f.caFile != "" {
		if auth.CABundle, err = os.ReadFile(f.caFile); err != nil {
			return nil, fmt.Errorf("--source-ca-file: %w", err)
		}
	} else if pem := os.Getenv(sourceCAEnv); pem != "" {
		// What the install manifests give: a key of Secret
		// capstan-secrets, which the Deployment maps to the environment.
		auth.CABundle, caFrom = []byte(pem), "$"+sourceCAEnv
	}
	if len(auth.CABundle) > 0 {
		if _, err := sources.CertPool(auth.CABundle); err != nil {
			return nil, fmt.Errorf("%s: %w", caFrom, err)
		}
	}
	return &reconciler.RootOptions{
		URL: f.url, Branch: f.branch, Path: f.path, Namespace: f.namespace, Namespaces: f.namespaces,
		Interval: f.interval, Auth: auth,
	}, nil
}

// listenFlags say where the daemon serves metrics, probes and the push
// receiver; `run` and `dev` share them.
type listenFlags struct {
	metricsAddr, healthAddr, webhookAddr string
}

// BindFlags binds the flags with these defaults.
func (f *listenFlags) BindFlags(fs *pflag.FlagSet, defaults listenFlags) {
	fs.StringVar(&f.metricsAddr, "metrics-addr", defaults.metricsAddr, `address of the Prometheus metrics endpoint; "0" disables it`)
	fs.StringVar(&f.healthAddr, "health-addr", defaults.healthAddr, `address of /healthz and /readyz; "0" disables it`)
	fs.StringVar(&f.webhookAddr, "webhook-addr", defaults.webhookAddr, `address of the push receiver (POST /hook/github|gitlab|gitea|generic), e.g. ":9292"; secrets come from $CAPSTAN_WEBHOOK_GITHUB_SECRET, $CAPSTAN_WEBHOOK_GITLAB_TOKEN, $CAPSTAN_WEBHOOK_GITEA_SECRET, $CAPSTAN_WEBHOOK_TOKEN`)
}

// daemonFlags tune the daemon.
type daemonFlags struct {
	listenFlags
	pprofAddr            string
	workers, concurrency int
	waitSlice            time.Duration
	serviceAccount       string
	decryptionSecret     string
	logFormat            string
	leader               reconciler.LeaderElectionOptions
	sharding             reconciler.ShardingOptions
	mirrorInterval       time.Duration
	clusterName          string
}

func (f *daemonFlags) BindFlags(fs *pflag.FlagSet) {
	d := reconciler.DefaultOptions()
	f.listenFlags.BindFlags(fs, listenFlags{metricsAddr: d.MetricsAddr, healthAddr: d.HealthAddr})
	fs.StringVar(&f.pprofAddr, "pprof-addr", "", `address of Go's profiles (/debug/pprof/), e.g. "127.0.0.1:6060"; off by default, since profiles show what the process holds`)
	fs.IntVar(&f.workers, "workers", d.Workers, "ClusterDeployments reconciled at once")
	fs.IntVar(&f.concurrency, "apply-concurrency", d.ApplyConcurrency, "objects of one stage applied in parallel")
	fs.DurationVar(&f.waitSlice, "wait-slice", d.Reconciler.WaitSlice, "how long one attempt waits for a stage before it records progress")
	fs.StringVar(&f.decryptionSecret, "decryption-secret", "", "Secret (in the deployment's namespace) holding the sops keys (*.agekey, *.asc) of deployments of the root source that set no spec.decryption (docs/secrets.md)")
	fs.StringVar(&f.serviceAccount, "default-service-account", "", "ServiceAccount (in each ClusterDeployment's namespace) to act as for deployments that set no spec.serviceAccountName; empty: Capstan's own identity (docs/tenancy.md)")
	fs.StringVar(&f.logFormat, "log-format", "json", "log format: json or text")
	fs.BoolVar(&f.leader.Enabled, "leader-elect", d.LeaderElection.Enabled, "elect a leader through a Lease, so that of several replicas only one acts")
	fs.StringVar(&f.leader.Namespace, "leader-election-namespace", "", "namespace of the leader Lease (default: the pod's namespace, else capstan-system)")
	fs.StringVar(&f.leader.ID, "leader-election-id", d.LeaderElection.ID, "name of the leader Lease")
	fs.DurationVar(&f.leader.LeaseDuration, "leader-election-lease-duration", d.LeaderElection.LeaseDuration, "how long a standby waits after the leader's last renewal before it takes over")
	fs.DurationVar(&f.leader.RenewDeadline, "leader-election-renew-deadline", d.LeaderElection.RenewDeadline, "how long the leader tries to renew before it stops acting and exits")
	fs.DurationVar(&f.leader.RetryPeriod, "leader-election-retry-period", d.LeaderElection.RetryPeriod, "how often candidates try to take or renew the Lease")
	fs.DurationVar(&f.mirrorInterval, "mirror-interval", d.Reconciler.MirrorInterval, "how often the mirrors a pivot leaves in this cluster take the status of the deployment, Clusters and Machines in the target")
	ds := reconciler.DefaultShardingOptions()
	fs.BoolVar(&f.sharding.Enabled, "sharding", false, "every replica acts, each on its share of the ClusterDeployments (rendezvous hashing over the live replicas' Leases, docs/sharding.md); the leader alone runs the root source")
	fs.StringVar(&f.sharding.Group, "sharding-group", ds.Group, "name the sharded replicas share (label capstan.dev/replica-of of their Leases)")
	fs.StringVar(&f.sharding.Namespace, "sharding-namespace", "", "namespace of the replicas' membership Leases (default: the pod's namespace, else capstan-system)")
	fs.DurationVar(&f.sharding.LeaseDuration, "sharding-lease-duration", ds.LeaseDuration, "how long a replica counts as live after its last renewal, and a deployment's claim after its holder's last renewal: a dead replica's share moves after this")
	fs.DurationVar(&f.sharding.RenewPeriod, "sharding-renew-period", ds.RenewPeriod, "how often a replica renews its Lease and looks at the others' (at most a third of the lease duration)")
	fs.StringVar(&f.clusterName, "cluster-name", "", `this cluster's name, for people: in fencing records and on deployments it moves (default "cluster <id>")`)
}

// limitFlags bound what artifacts and renders may take, so that the
// daemon's memory holds whatever its sources contain (docs/limits.md).
type limitFlags struct {
	opts reconciler.ArtifactOptions
}

func (f *limitFlags) BindFlags(fs *pflag.FlagSet) {
	d := reconciler.DefaultArtifactOptions()
	f.opts = d
	fs.StringVar(&f.opts.CacheDir, "artifact-cache-dir", d.CacheDir, "directory where fetched artifacts are kept, on disk rather than in memory; the daemon uses a subdirectory of its own and removes it when it stops")
	fs.Var(byteSize{&f.opts.CacheMaxBytes}, "artifact-cache-max-bytes", "artifacts kept on disk, least recently used removed first; an artifact in use or fetched in the last minute stays (e.g. 512MiB)")
	fs.Var(byteSize{&f.opts.MaxFileBytes}, "max-file-bytes", "largest file of an artifact, and largest file a render reads")
	fs.Var(byteSize{&f.opts.MaxArtifactBytes}, "max-artifact-bytes", "largest artifact: all its files together, and an OCI artifact's compressed layer")
	fs.Var(byteSize{&f.opts.MaxDecompressedBytes}, "max-decompressed-bytes", "most bytes an OCI layer or a git pack may inflate to; a compressed bomb stops there while it streams")
	fs.Var(byteSize{&f.opts.MaxRenderBytes}, "max-render-bytes", "most bytes one render reads: the files its kustomizations reach, each counted once (kustomize takes about 13 times this in memory)")
	fs.IntVar(&f.opts.MaxObjects, "max-objects", d.MaxObjects, "most objects one revision of a deployment renders to")
	fs.IntVar(&f.opts.MaxConcurrentRenders, "max-concurrent-renders", d.MaxConcurrentRenders, "renders running at once; each takes up to about 13 times --max-render-bytes of memory")
}

// byteSize is a flag of a byte count: 1048576, 1MiB, 1Mi, 512KiB, 2GiB.
type byteSize struct{ v *int64 }

func (b byteSize) String() string {
	if b.v == nil {
		return ""
	}
	return sources.FormatBytes(*b.v)
}

func (b byteSize) Type() string { return "bytes" }

func (b byteSize) Set(s string) error {
	n, err := parseBytes(s)
	if err != nil {
		return err
	}
	*b.v = n
	return nil
}

// parseBytes reads a byte count with an optional binary unit.
func parseBytes(s string) (int64, error) {
	num := strings.TrimRight(s, "KMGTiB")
	unit := s[len(num):]
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q: want a positive number of bytes, e.g. 8MiB, 512KiB or 1048576", s)
	}
	shift := map[string]uint{"": 0, "B": 0, "Ki": 10, "KiB": 10, "Mi": 20, "MiB": 20, "Gi": 30, "GiB": 30, "Ti": 40, "TiB": 40}
	sh, ok := shift[unit]
	if !ok {
		return 0, fmt.Errorf("%q: unknown unit %q; use B, KiB, MiB, GiB or TiB", s, unit)
	}
	if n > math.MaxInt64>>sh {
		return 0, fmt.Errorf("%q: too large", s)
	}
	return n << sh, nil
}

func newRunCommand() *cobra.Command {
	var cluster clusterFlags
	var root rootFlags
	var daemon daemonFlags
	var self selfInstallFlags
	var limits limitFlags
	var rep reportFlags
	var kubeconfigs kubeconfigFlags
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the daemon: reconcile every ClusterDeployment, and those committed under the root source",
		Example: `  # adding a cluster is a git push: every ClusterDeployment under clusters/ is managed
  capstan run --source https://git.example/infra.git --branch main --path clusters/`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			setLogger(daemon.logFormat)
			if sa := daemon.serviceAccount; sa != "" {
				if errs := validation.IsDNS1123Subdomain(sa); len(errs) > 0 {
					return fmt.Errorf("--default-service-account %q is not a ServiceAccount name: %s", sa, strings.Join(errs, "; "))
				}
			}
			// The flags are checked before the cluster is reached.
			rootOpts, err := root.options(limits.opts)
			if err != nil {
				return err
			}
			cfg, err := cluster.restConfig()
			if err != nil {
				return err
			}
			opts := reconciler.DefaultOptions()
			opts.Config = cfg
			opts.Root = rootOpts
			opts.MetricsAddr, opts.HealthAddr = daemon.metricsAddr, daemon.healthAddr
			opts.PprofAddr = daemon.pprofAddr
			opts.Workers, opts.ApplyConcurrency = daemon.workers, daemon.concurrency
			opts.Reconciler.WaitSlice = daemon.waitSlice
			opts.Reconciler.DefaultServiceAccount = daemon.serviceAccount
			opts.Reconciler.DecryptionSecret = daemon.decryptionSecret
			opts.Webhook = daemon.webhook()
			opts.LeaderElection = daemon.leader
			opts.Sharding = daemon.sharding
			opts.Reconciler.MirrorInterval = daemon.mirrorInterval
			opts.ClusterName = daemon.clusterName
			opts.Artifacts = limits.opts
			opts.Report = rep.opts
			opts.Kubeconfigs = kubeconfigs.policy
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
	limits.BindFlags(cmd.Flags())
	rep.BindFlags(cmd.Flags())
	kubeconfigs.BindFlags(cmd.Flags())
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
func (f *listenFlags) webhook() *reconciler.WebhookOptions {
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
