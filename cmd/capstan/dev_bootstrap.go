package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capstan-dev/capstan/internal/sim"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/sources/dir"
)

// Scenarios of `capstan dev`.
const (
	scenarioMgmt      = "mgmt"
	scenarioBootstrap = "bootstrap"
	// bootstrapPath holds the bootstrap scenario's ClusterDeployment.
	bootstrapPath = "clusters/bootstrap"
)

// devClusters are the two control planes of the bootstrap scenario.
type devClusters struct {
	bootstrap, target *testenv.Env
}

// startDevClusters starts the bootstrap control plane and the target one
// side by side, each with kube-controller-manager (Deployments get
// ReplicaSets and Pods, which the simulated kubelet runs) and the CRDs of
// Capstan and the providers: the target's Helm bundle would install the
// latter, and a move needs them served before it copies anything.
func startDevClusters(ctx context.Context, out io.Writer, crds []string) (*devClusters, error) {
	progress := &syncWriter{w: out}
	var dc devClusters
	g, gctx := errgroup.WithContext(ctx)
	for _, c := range []struct {
		env    **testenv.Env
		prefix string
	}{{&dc.bootstrap, "    bootstrap: "}, {&dc.target, "    target:    "}} {
		g.Go(func() error {
			env, err := testenv.Start(gctx, testenv.Options{CRDDirs: crds, ControllerManager: true,
				Progress: &indent{w: progress, prefix: c.prefix}})
			*c.env = env
			return err
		})
	}
	if err := g.Wait(); err != nil {
		dc.stop(io.Discard)
		return nil, fmt.Errorf("start the control planes: %w", err)
	}
	return &dc, nil
}

func (dc *devClusters) stop(out io.Writer) {
	for _, env := range []*testenv.Env{dc.bootstrap, dc.target} {
		if env == nil {
			continue
		}
		if err := env.Stop(); err != nil {
			fmt.Fprintln(out, "stop a control plane:", err)
		}
	}
}

// syncWriter serializes writes from several goroutines.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

// runDevBootstrap is `capstan dev --scenario bootstrap`: a bootstrap
// control plane and a target one, the simulated providers and a
// simulated kubelet on both, the Capstan of the bootstrap cluster with
// examples/ as its root source, and the Capstan of the target as a second
// daemon in this process. The first walks the bootstrap profile's stages
// up to the pivot, which moves the deployment into the target; the second
// finishes there.
func runDevBootstrap(ctx context.Context, out io.Writer, f devFlags) error {
	begin := time.Now()
	p := &devPrinter{out: out, begin: begin}
	if f.verbose {
		ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, nil)))
	} else {
		ctrl.SetLogger(logr.Discard())
	}
	repo, err := testenv.RepoRoot()
	if err != nil {
		return fmt.Errorf("capstan dev runs from a checkout of the Capstan repository (it builds the control planes from e2e/testbin and reads examples/): %w", err)
	}
	providers, err := testenv.ProviderCRDDirs(ctx)
	if err != nil {
		return fmt.Errorf("provider CRDs: %w", err)
	}
	p.step("two control planes on loopback, the bootstrap cluster and the one it builds: etcd, kube-apiserver and kube-controller-manager each (the first run builds them from source, ~15 min on 2 cores)")
	dc, err := startDevClusters(ctx, out, append([]string{filepath.Join(repo, "manifests", "crds")}, providers...))
	if err != nil {
		return err
	}
	defer dc.stop(out)
	p.step("bootstrap cluster ready; kubectl --kubeconfig %s get clusterdeployments -A", dc.bootstrap.KubeconfigPath)
	p.step("target cluster ready:    kubectl --kubeconfig %s get clusterdeployments -A", dc.target.KubeconfigPath)
	ready := time.Now()
	kubeconfig, err := os.ReadFile(dc.target.KubeconfigPath)
	if err != nil {
		return err
	}

	boot, err := client.New(dc.bootstrap.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		return err
	}
	target, err := client.New(dc.target.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		return err
	}
	if err := ensureDevNamespace(ctx, boot); err != nil {
		return err
	}
	root, closeRoot, err := devRoot(ctx, p, repo, f)
	if err != nil {
		return err
	}
	defer closeRoot()

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 8)
	components, err := devBootstrapComponents(p, dc, kubeconfig, f)
	if err != nil {
		return err
	}
	for name, run := range components {
		go func() { errc <- named(name, run(runCtx)) }()
	}
	startDaemon := func(name string, tune func(*reconciler.Options)) error {
		opts := reconciler.DefaultOptions()
		opts.MetricsAddr, opts.HealthAddr = "0", "0"
		opts.Reconciler.WaitSlice = 5 * time.Second
		// One daemon per throw-away control plane: nothing to elect.
		opts.LeaderElection.Enabled = false
		tune(&opts)
		daemon, err := reconciler.New(opts)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		go func() { errc <- named(name, daemon.Run(runCtx)) }()
		return nil
	}
	err = startDaemon("bootstrap reconciler", func(o *reconciler.Options) {
		o.Config, o.Root, o.ClusterName = dc.bootstrap.Config, root, "bootstrap"
	})
	if err != nil {
		return err
	}
	p.step("simulators (providers, kubelets; LCM agents in the target) and the bootstrap Capstan running")

	// The Capstan of the target starts once the deployment arrived there,
	// as one installed by the pivot would: with the same root source, which
	// before the move would create the deployment there, and the move
	// refuses a deployment it did not create.
	tRoot, closeTargetRoot, err := targetRoot(root, f)
	if err != nil {
		return err
	}
	defer closeTargetRoot()
	arrived := func() error {
		p.step("target Capstan: a second daemon in this process (no node to run a pod here)")
		return startDaemon("target reconciler", func(o *reconciler.Options) {
			o.Config, o.Root, o.ClusterName = dc.target.Config, tRoot, "target"
		})
	}

	watchCtx := runCtx
	if f.exitWhenReady && f.timeout > 0 {
		var cancel context.CancelFunc
		watchCtx, cancel = context.WithDeadline(runCtx, ready.Add(f.timeout))
		defer cancel()
	}
	w := &pivotWatch{boot: boot, target: target, p: p, only: f.cluster, errc: errc, arrived: arrived,
		bp: &devPrinter{out: out, begin: begin}, tp: &devPrinter{out: out, begin: begin}}
	if err := w.untilDone(watchCtx); err != nil {
		return err
	}
	w.summary(ctx)
	p.step("%s Ready in the target cluster, %s after start", w.name, time.Since(begin).Round(100*time.Millisecond))
	if f.exitWhenReady {
		return nil
	}
	p.step("still running: push to the repository and watch the target's Capstan roll it out; Ctrl-C stops")
	return w.keepFollowing(ctx)
}

// targetRoot is the root source of the target's Capstan: the same
// repository, or the same directory read by a source of its own.
func targetRoot(root *reconciler.RootOptions, f devFlags) (*reconciler.RootOptions, func(), error) {
	out := *root
	if f.dir == "" {
		return &out, func() {}, nil
	}
	src, err := dir.New(dir.Options{Path: f.dir})
	if err != nil {
		return nil, nil, fmt.Errorf("--dir: %w", err)
	}
	out.Source = src
	return &out, func() {}, nil
}

// devBootstrapComponents are the simulated parts of both clusters, by
// name: the providers (writing each Cluster's kubeconfig Secret pointed
// at the target), a kubelet per cluster, and the LCM agents, which report
// to the target: the cluster MachinesLCMAgentUpdated points them at.
func devBootstrapComponents(p *devPrinter, dc *devClusters, kubeconfig []byte, f devFlags) (map[string]func(context.Context) error, error) {
	out := map[string]func(context.Context) error{}
	pace := func(d time.Duration) time.Duration { return time.Duration(float64(d) / f.simSpeed) }
	for _, c := range []struct {
		name string
		env  *testenv.Env
	}{{"bootstrap", dc.bootstrap}, {"target", dc.target}} {
		opts := sim.DefaultOptions()
		opts.Delays = scaleDelays(opts.Delays, f.simSpeed)
		opts.Kubeconfig = func(types.NamespacedName) []byte { return kubeconfig }
		if f.verbose {
			opts.Events = func(ev sim.Event) { p.detail("%s sim: %s", c.name, ev) }
		}
		s, err := sim.New(c.env.Config, opts)
		if err != nil {
			return nil, fmt.Errorf("start the %s simulator: %w", c.name, err)
		}
		out[c.name+" simulator"] = s.Run
		watcher, err := client.NewWithWatch(c.env.Config, client.Options{Scheme: clientgoscheme.Scheme})
		if err != nil {
			return nil, err
		}
		out[c.name+" kubelet"] = sim.NewKubelet(watcher, sim.KubeletOptions{StartDelay: pace(time.Second)}).Run
		if c.name == "target" {
			lcm := sim.DefaultLCMOptions()
			lcm.ItemDelay = pace(time.Second)
			out["target LCM agents"] = sim.NewLCMAgent(watcher, lcm).Run
		}
	}
	return out, nil
}
