package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/sim"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/sources/dir"
	"github.com/capstan-dev/capstan/sources/git"
)

// devNamespace holds the demo's ClusterDeployments.
const devNamespace = "capstan-system"

type devFlags struct {
	dir           string
	path          string
	cluster       string
	exitWhenReady bool
	timeout       time.Duration
	verbose       bool
	simSpeed      float64
	providers     string
	scenario      string
	kubeconfig    string
	listen        listenFlags
	// flags tell the flags given on the command line from defaults.
	flags *pflag.FlagSet
}

func newDevCommand() *cobra.Command {
	var f devFlags
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the whole thing locally: a control plane, a git repository of examples/, the provider simulator and the reconciler",
		Long: `Dev starts a local control plane (etcd and kube-apiserver from the cached
test binaries, built from source on first use), puts examples/ into a local
git repository served over HTTP, starts the provider simulator (it plays
Cluster API, CAPM3, the BareMetal Operator and the LCM agent) and the
reconciler, and shows the example management cluster's stages advancing
until it is Ready.

It keeps running until Ctrl-C (or SIGTERM), also when a stage stalls or a
file is broken: it prints the error and follows, so you can push a fix to
the repository (or edit the files, with --dir) and watch it roll out. Only
--exit-when-ready makes it exit by itself.

It writes a kubeconfig whose context defaults to the demo's namespace
(--kubeconfig-out, printed with the export line to use it), and serves
metrics, health probes and the push webhook as "capstan run" does, on
loopback. On exit it stops what it started and removes every file it made,
the kubeconfig included, also when its output is closed (piped into head).

Run it from a checkout of the Capstan repository.`,
		Example: `  capstan dev                                   # watch examples/clusters/mgmt reach Ready, then keep running
  capstan dev --dir examples                    # read examples/ in place: an edit shows up within a second
  capstan dev --exit-when-ready --timeout 10m   # scripted smoke test: exit 0 once Ready
  capstan dev --scenario bootstrap              # examples/clusters/bootstrap: 16 stages through a real pivot into a second control plane

  # in another shell, while it runs:
  export KUBECONFIG=~/.cache/capstan/dev/kubeconfig
  kubectl get clusterdeployments; capstan status`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.scenario == scenarioBootstrap && !cmd.Flags().Changed("path") {
				f.path = bootstrapPath
			}
			f.flags = cmd.Flags()
			return runDev(cmd.Context(), cmd.OutOrStdout(), f)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.dir, "dir", "", "read this directory in place (fsnotify) instead of a git repository of examples/")
	fs.StringVar(&f.path, "path", "clusters/mgmt", "path holding the ClusterDeployments to run, in the repository or --dir")
	fs.StringVar(&f.cluster, "cluster", "", "the one ClusterDeployment whose stages are shown and waited for (default: every one under --path)")
	fs.BoolVar(&f.exitWhenReady, "exit-when-ready", false, "exit 0 once the cluster is Ready; non-zero with the message as soon as one stalls, or with the stuck stage once --timeout passes (without it, dev runs until Ctrl-C whatever happens)")
	fs.DurationVar(&f.timeout, "timeout", 15*time.Minute, "with --exit-when-ready, how long to wait for Ready (not counting the first build of the control plane)")
	fs.BoolVar(&f.verbose, "verbose", false, "also print what the simulator does and the daemon's logs")
	fs.Float64Var(&f.simSpeed, "sim-speed", 1, "speed-up of the simulated providers (10 = ten times faster than the demo pace)")
	fs.StringVar(&f.scenario, "scenario", scenarioMgmt, "what to run: mgmt (one control plane, the clusters under --path) or bootstrap (a bootstrap control plane and the one it builds, examples/clusters/bootstrap walked through a real pivot by two daemons)")
	fs.StringVar(&f.providers, "providers", providersSim, "who builds the clusters: sim (the simulator, fast) or real (Cluster API, CAPM3, IPAM and the BareMetal Operator built from their modules, with BMO's demo hardware and fake workload clusters; docs/providers.md)")
	fs.StringVar(&f.kubeconfig, "kubeconfig-out", defaultDevKubeconfig(), "where to write the demo's kubeconfig (removed on exit); while another capstan dev holds it, this one writes into its temporary directory and says so")
	f.listen.BindFlags(fs, devListenDefaults)
	return cmd
}

// checkDevFlags refuses flags that cannot work before anything starts.
func checkDevFlags(f devFlags) error {
	if f.providers != providersSim && f.providers != providersReal {
		return fmt.Errorf("--providers %q: want %s or %s", f.providers, providersSim, providersReal)
	}
	if f.providers == providersReal && f.dir != "" {
		return fmt.Errorf("--providers real reads the examples through the local git repository, where it moves each cluster's API endpoint to 127.0.0.1; drop --dir")
	}
	if f.simSpeed <= 0 {
		return fmt.Errorf("--sim-speed %g: want a positive factor (1 is the demo pace, 10 ten times faster, 0.5 half as fast)", f.simSpeed)
	}
	switch f.scenario {
	case scenarioMgmt:
	case scenarioBootstrap:
		if f.providers != providersSim {
			return fmt.Errorf("--scenario bootstrap runs on the simulated providers only: they write the new cluster's kubeconfig Secret pointing at the second control plane; drop --providers %s", f.providers)
		}
	default:
		return fmt.Errorf("--scenario %q: want %s or %s", f.scenario, scenarioMgmt, scenarioBootstrap)
	}
	return nil
}

// devRun is what every scenario shares: the output, the printer, the
// workspace and where the daemon serves.
type devRun struct {
	f     devFlags
	out   io.Writer
	p     *devPrinter
	ws    *devWorkspace
	serve *devServe
	repo  string
}

func runDev(ctx context.Context, stdout io.Writer, f devFlags) (err error) {
	if err := checkDevFlags(f); err != nil {
		return err
	}
	// Output that can no longer be written stops the run, which then
	// removes what it made and returns why.
	ctx, out := newDevOutput(ctx, stdout)
	defer func() {
		// A closed output is why anything else failed.
		if oerr := out.err(); oerr != nil {
			err = oerr
		}
	}()
	r := &devRun{f: f, out: out, p: &devPrinter{out: out, begin: time.Now()}}
	if f.verbose {
		ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, nil)))
	} else {
		ctrl.SetLogger(logr.Discard())
	}
	if r.repo, err = testenv.RepoRoot(); err != nil {
		return fmt.Errorf("capstan dev runs from a checkout of the Capstan repository (it builds the control plane from e2e/testbin and reads examples/): %w", err)
	}
	if r.ws, err = newDevWorkspace(f.kubeconfig); err != nil {
		return err
	}
	defer func() {
		if err := r.ws.Close(); err != nil {
			r.p.step("stopped; %v", err)
			return
		}
		r.p.step("stopped; removed %s and %s", r.ws.Dir, r.ws.Kubeconfig)
	}()
	if r.serve, err = resolveDevServe(f.listen, f.flags, r.ws.Path("webhook-token")); err != nil {
		return err
	}
	for _, note := range r.serve.notes {
		r.p.step("%s", note)
	}
	if f.scenario == scenarioBootstrap {
		return r.bootstrap(ctx)
	}
	return r.mgmt(ctx)
}

// mgmt is the mgmt scenario: one control plane, the clusters under --path.
func (r *devRun) mgmt(ctx context.Context) error {
	f, p := r.f, r.p
	envOpts := testenv.Options{
		CRDDirs:  []string{filepath.Join(r.repo, "manifests", "crds")},
		Progress: &indent{w: r.out, prefix: "    "},
		Dir:      r.ws.Path("controlplane"),
	}
	if f.providers == providersReal {
		p.step("control plane and the real providers on loopback (the first run builds them from source, ~25 min on 2 cores)")
		envOpts.Providers = true
	} else {
		p.step("control plane: etcd and kube-apiserver on loopback (the first run builds them from source, ~15 min on 2 cores)")
		providers, err := testenv.ProviderCRDDirs(ctx)
		if err != nil {
			return fmt.Errorf("provider CRDs: %w", err)
		}
		envOpts.CRDDirs = append(envOpts.CRDDirs, providers...)
	}
	env, err := testenv.Start(ctx, envOpts)
	if err != nil {
		return fmt.Errorf("start the control plane: %w", err)
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(r.out, "stop the control plane:", err)
		}
	}()
	if err := r.ws.WriteKubeconfig([]devKubeContext{{Name: devContext, Config: env.Config}}); err != nil {
		return err
	}
	p.step("control plane ready")
	p.lines(devKubeconfigHint(r.ws, []string{devContext}))
	// The wait budget starts now: the first build is not the cluster's fault.
	ready := time.Now()

	c, err := client.New(env.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		return err
	}
	if err := ensureDevNamespace(ctx, c); err != nil {
		return err
	}
	if err := ensureDevDecryptionKey(ctx, c, r.repo); err != nil {
		return err
	}
	root, closeRoot, err := devRoot(ctx, p, r.repo, r.ws.Path("git"), f)
	if err != nil {
		return err
	}
	defer closeRoot()

	comps := newDevComponents(ctx)
	defer comps.stop(p)
	if f.providers == providersSim {
		simOpts := sim.DefaultOptions()
		simOpts.Delays = scaleDelays(simOpts.Delays, f.simSpeed)
		if f.verbose {
			simOpts.Events = func(ev sim.Event) { p.detail("sim: %s", ev) }
		}
		simulator, err := sim.New(env.Config, simOpts)
		if err != nil {
			return fmt.Errorf("start the simulator: %w", err)
		}
		comps.start("simulator", simulator.Run)
	}
	watcher, err := client.NewWithWatch(env.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		return err
	}
	lcmOpts := sim.DefaultLCMOptions()
	// A StateItem takes about a second at demo pace, so that the rollout's
	// order (managers one by one, then workers) can be watched.
	lcmOpts.ItemDelay = time.Duration(float64(time.Second) / f.simSpeed)
	comps.start("LCM agent simulator", sim.NewLCMAgent(watcher, lcmOpts).Run)

	d, err := reconciler.New(r.daemonOptions(env, root, true))
	if err != nil {
		return err
	}
	comps.start("reconciler", d.Run)
	p.lines(r.serve.lines(d.WebhookURL(), root.URL, root.Branch))
	running := "simulator and reconciler running"
	if f.providers == providersReal {
		running = "real providers and reconciler running"
	}
	if f.cluster != "" {
		p.step("%s; waiting for ClusterDeployment %s/%s", running, devNamespace, f.cluster)
	} else {
		p.step("%s; waiting for every ClusterDeployment under %s", running, f.path)
	}

	watchCtx := ctx
	if f.exitWhenReady && f.timeout > 0 {
		var cancel context.CancelFunc
		watchCtx, cancel = context.WithDeadline(ctx, ready.Add(f.timeout))
		defer cancel()
	}
	w := &devWatch{c: c, p: p, only: f.cluster, root: rootWatch{status: d.RootStatus}}
	return follow(watchCtx, w, comps.errc, followOptions{exitWhenReady: f.exitWhenReady, ready: func() {
		p.step("%s Ready, %s after start", w.names(), time.Since(p.begin).Round(100*time.Millisecond))
		if !f.exitWhenReady {
			p.step("still running: push to the repository (or edit --dir) and watch it roll out; Ctrl-C stops")
		}
	}})
}

// daemonOptions are a demo daemon's: on the cluster of env, with the
// root source, its artifacts in the workspace, and (serve) the metrics,
// probes and webhook addresses.
func (r *devRun) daemonOptions(env *testenv.Env, root *reconciler.RootOptions, serve bool) reconciler.Options {
	opts := reconciler.DefaultOptions()
	opts.Config = env.Config
	opts.Root = root
	opts.MetricsAddr, opts.HealthAddr = "0", "0"
	if serve {
		opts.MetricsAddr, opts.HealthAddr, opts.Webhook = r.serve.metricsAddr, r.serve.healthAddr, r.serve.webhook
	}
	opts.Artifacts.CacheDir = r.ws.Path("artifacts")
	opts.Reconciler.WaitSlice = 5 * time.Second
	// One daemon per throw-away control plane: nothing to elect.
	opts.LeaderElection.Enabled = false
	return opts
}

// devComponents are the demo's goroutines: simulators and daemons.
type devComponents struct {
	ctx    context.Context
	cancel context.CancelFunc
	errc   chan error
	wg     sync.WaitGroup
}

func newDevComponents(ctx context.Context) *devComponents {
	ctx, cancel := context.WithCancel(ctx)
	return &devComponents{ctx: ctx, cancel: cancel, errc: make(chan error, 16)}
}

// start runs a component; an error it stops with, named, ends the dev
// loop (through errc).
func (c *devComponents) start(name string, run func(context.Context) error) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		err := run(c.ctx)
		if err == nil || errors.Is(err, context.Canceled) || c.ctx.Err() != nil {
			return
		}
		select {
		case c.errc <- fmt.Errorf("%s: %w", name, err):
		default:
		}
	}()
}

// devStopWait bounds how long stop waits for the components.
const devStopWait = time.Minute

// stop cancels the components and waits for them to return: the daemon
// removes its artifacts and stops calling the API server before the
// control plane stops.
func (c *devComponents) stop(p *devPrinter) {
	c.cancel()
	done := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(done)
	}()
	timer := time.NewTimer(devStopWait)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		p.step("the simulators and daemons still run %s after the stop; stopping the control plane anyway", devStopWait)
	}
}

// scaleDelays makes the simulated providers speed times faster.
func scaleDelays(d sim.Delays, speed float64) sim.Delays {
	if speed == 1 {
		return d
	}
	for _, f := range []*time.Duration{&d.HostRegistration, &d.HostInspection, &d.HostProvisioning,
		&d.HostDeprovisioning, &d.MachineBoot, &d.Default} {
		*f = time.Duration(float64(*f) / speed)
	}
	return d
}

// devRoot is the root source of the demo: a git repository holding
// examples/ served over HTTP from gitDir, or the --dir directory read in
// place.
func devRoot(ctx context.Context, p *devPrinter, repo, gitDir string, f devFlags) (*reconciler.RootOptions, func(), error) {
	if f.dir != "" {
		src, err := dir.New(dir.Options{Path: f.dir})
		if err != nil {
			return nil, nil, fmt.Errorf("--dir: %w", err)
		}
		p.step("root source: %s (edits apply within a second)", src.Path())
		return &reconciler.RootOptions{URL: "dir://" + src.Path(), Path: f.path, Namespace: devNamespace,
			Interval: time.Minute, Source: src}, func() {}, nil
	}
	secret := make([]byte, 12)
	if _, err := rand.Read(secret); err != nil {
		return nil, nil, err
	}
	password := hex.EncodeToString(secret)
	srv, err := gitserver.New(gitDir, gitserver.Options{Username: "dev", Password: password})
	if err != nil {
		return nil, nil, fmt.Errorf("start the git server for examples/ (it runs git; without git, --dir examples reads them in place): %w", err)
	}
	url, err := srv.CreateRepo("examples")
	if err != nil {
		srv.Close()
		return nil, nil, err
	}
	files, err := repoFiles(filepath.Join(repo, "examples"))
	if err != nil {
		srv.Close()
		return nil, nil, err
	}
	if f.providers == providersReal {
		var moved []string
		if files, moved, err = localEndpoints(files); err != nil {
			srv.Close()
			return nil, nil, err
		}
		for _, m := range moved {
			p.step("%s (served by workload-clusters)", m)
		}
	}
	if _, err := srv.CommitFiles("examples", gitserver.DefaultBranch, files, "examples from the Capstan checkout"); err != nil {
		srv.Close()
		return nil, nil, fmt.Errorf("commit examples/: %w", err)
	}
	credentials := filepath.Join(srv.Dir(), "credentials")
	if err := os.WriteFile(credentials, []byte("dev:"+password+"\n"), 0o600); err != nil {
		srv.Close()
		return nil, nil, err
	}
	p.step("root source: %s (branch main, path %s; user dev, password in %s)", url, f.path, credentials)
	return &reconciler.RootOptions{URL: url, Branch: gitserver.DefaultBranch, Path: f.path, Namespace: devNamespace,
		Interval: 2 * time.Second, Auth: git.Auth{Username: "dev", Password: password}}, func() { srv.Close() }, nil
}

// repoFiles reads a directory tree as files to commit.
func repoFiles(root string) ([]gitserver.File, error) {
	var files []gitserver.File
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		content, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		files = append(files, gitserver.File{Path: filepath.ToSlash(rel), Content: string(content)})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", root, err)
	}
	return files, nil
}
