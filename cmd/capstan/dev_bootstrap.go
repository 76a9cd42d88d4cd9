package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
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
// side by side, in dirs of ws, each with kube-controller-manager
// (Deployments get ReplicaSets and Pods, which the simulated kubelet runs)
// and the CRDs of Capstan and the providers: the target's Helm bundle
// would install the latter, and a move needs them served before it copies
// anything.
func startDevClusters(ctx context.Context, out io.Writer, ws *devWorkspace, crds []string) (*devClusters, error) {
	progress := &syncWriter{w: out}
	var dc devClusters
	g, gctx := errgroup.WithContext(ctx)
	for _, c := range []struct {
		env    **testenv.Env
		name   string
		prefix string
	}{{&dc.bootstrap, "bootstrap", "    bootstrap: "}, {&dc.target, "target", "    target:    "}} {
		g.Go(func() error {
			env, err := testenv.Start(gctx, testenv.Options{CRDDirs: crds, ControllerManager: true,
				Progress: &indent{w: progress, prefix: c.prefix}, Dir: ws.Path(c.name)})
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

// bootstrap is `capstan dev --scenario bootstrap`: a bootstrap control
// plane and a target one, the simulated providers and a simulated kubelet
// on both, the Capstan of the bootstrap cluster with examples/ as its
// root source, and the Capstan of the target as a second daemon in this
// process. The first walks the bootstrap profile's stages up to the
// pivot, which moves the deployment into the target; the second finishes
// there. The bootstrap's daemon serves the metrics (of both: they share
// the registry), probes and webhook.
func (r *devRun) bootstrap(ctx context.Context) error {
	f, p := r.f, r.p
	providers, err := testenv.ProviderCRDDirs(ctx)
	if err != nil {
		return fmt.Errorf("provider CRDs: %w", err)
	}
	p.step("two control planes on loopback, the bootstrap cluster and the one it builds: etcd, kube-apiserver and kube-controller-manager each (the first run builds them from source, ~15 min on 2 cores)")
	dc, err := startDevClusters(ctx, r.out, r.ws, append([]string{filepath.Join(r.repo, "manifests", "crds")}, providers...))
	if err != nil {
		return err
	}
	defer dc.stop(r.out)
	const targetContext = devContext + "-target"
	if err := r.ws.WriteKubeconfig([]devKubeContext{{Name: devContext, Config: dc.bootstrap.Config}, {Name: targetContext, Config: dc.target.Config}}); err != nil {
		return err
	}
	p.step("both control planes ready: context %s is the bootstrap cluster, %s the target", devContext, targetContext)
	p.lines(devKubeconfigHint(r.ws, []string{devContext, targetContext}))
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
	// The pivot copies it into the target with the deployment.
	if err := ensureDevDecryptionKey(ctx, boot, r.repo); err != nil {
		return err
	}
	root, closeRoot, err := devRoot(ctx, p, r.repo, r.ws.Path("git"), f)
	if err != nil {
		return err
	}
	defer closeRoot()

	comps := newDevComponents(ctx)
	defer comps.stop(p)
	components, err := devBootstrapComponents(p, dc, kubeconfig, f)
	if err != nil {
		return err
	}
	for name, run := range components {
		comps.start(name, run)
	}
	bootOpts := r.daemonOptions(dc.bootstrap, root, true)
	bootOpts.ClusterName = "bootstrap"
	daemon, err := reconciler.New(bootOpts)
	if err != nil {
		return fmt.Errorf("bootstrap reconciler: %w", err)
	}
	comps.start("bootstrap reconciler", daemon.Run)
	p.step("simulators (providers, kubelets; LCM agents in the target) and the bootstrap Capstan running")
	p.lines(r.serve.lines(daemon.WebhookURL(), root.URL, root.Branch))

	// The Capstan of the target starts once the deployment arrived there,
	// as one installed by the pivot would: with the same root source, which
	// before the move would create the deployment there, and the move
	// refuses a deployment it did not create.
	tRoot, err := targetRoot(root, f)
	if err != nil {
		return err
	}
	arrived := func() error {
		p.step("target Capstan: a second daemon in this process (no node to run a pod here)")
		opts := r.daemonOptions(dc.target, tRoot, false)
		opts.ClusterName = "target"
		d, err := reconciler.New(opts)
		if err != nil {
			return fmt.Errorf("target reconciler: %w", err)
		}
		comps.start("target reconciler", d.Run)
		return nil
	}

	watchCtx := ctx
	if f.exitWhenReady && f.timeout > 0 {
		var cancel context.CancelFunc
		watchCtx, cancel = context.WithDeadline(ctx, ready.Add(f.timeout))
		defer cancel()
	}
	w := &pivotWatch{boot: boot, target: target, p: p, only: f.cluster, arrived: arrived,
		root: rootWatch{status: daemon.RootStatus},
		bp:   &devPrinter{out: r.out, begin: p.begin}, tp: &devPrinter{out: r.out, begin: p.begin}}
	return follow(watchCtx, w, comps.errc, followOptions{exitWhenReady: f.exitWhenReady, ready: func() {
		w.summary(ctx)
		p.step("%s Ready in the target cluster, %s after start", w.name, time.Since(p.begin).Round(100*time.Millisecond))
		if !f.exitWhenReady {
			p.step("still running: push to the repository and watch the target's Capstan roll it out; Ctrl-C stops")
		}
	}})
}

// targetRoot is the root source of the target's Capstan: the same
// repository, or the same directory read by a source of its own.
func targetRoot(root *reconciler.RootOptions, f devFlags) (*reconciler.RootOptions, error) {
	out := *root
	if f.dir == "" {
		return &out, nil
	}
	src, err := dir.New(dir.Options{Path: f.dir})
	if err != nil {
		return nil, fmt.Errorf("--dir: %w", err)
	}
	out.Source = src
	return &out, nil
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
