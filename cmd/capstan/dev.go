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
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
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
until it is Ready. It then keeps running, so you can push changes to the
repository (or edit files, with --dir) and watch them roll out; Ctrl-C stops
everything and removes what it started.

Run it from a checkout of the Capstan repository.`,
		Example: `  capstan dev                                   # watch examples/clusters/mgmt reach Ready, then keep running
  capstan dev --dir examples                    # read examples/ in place: an edit shows up within a second
  capstan dev --exit-when-ready --timeout 10m   # scripted smoke test: exit 0 once Ready
  capstan dev --scenario bootstrap              # examples/clusters/bootstrap: 15 stages through a real pivot into a second control plane`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.scenario == scenarioBootstrap && !cmd.Flags().Changed("path") {
				f.path = bootstrapPath
			}
			return runDev(cmd.Context(), cmd.OutOrStdout(), f)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.dir, "dir", "", "read this directory in place (fsnotify) instead of a git repository of examples/")
	fs.StringVar(&f.path, "path", "clusters/mgmt", "path holding the ClusterDeployments to run, in the repository or --dir")
	fs.StringVar(&f.cluster, "cluster", "", "the one ClusterDeployment whose stages are shown and waited for (default: every one under --path)")
	fs.BoolVar(&f.exitWhenReady, "exit-when-ready", false, "exit 0 once the cluster is Ready; non-zero with the stuck stage's message if it stalls or --timeout passes")
	fs.DurationVar(&f.timeout, "timeout", 15*time.Minute, "with --exit-when-ready, how long to wait for Ready (not counting the first build of the control plane)")
	fs.BoolVar(&f.verbose, "verbose", false, "also print what the simulator does and the daemon's logs")
	fs.Float64Var(&f.simSpeed, "sim-speed", 1, "speed-up of the simulated providers (10 = ten times faster than the demo pace)")
	fs.StringVar(&f.scenario, "scenario", scenarioMgmt, "what to run: mgmt (one control plane, the clusters under --path) or bootstrap (a bootstrap control plane and the one it builds, examples/clusters/bootstrap walked through a real pivot by two daemons)")
	fs.StringVar(&f.providers, "providers", providersSim, "who builds the clusters: sim (the simulator, fast) or real (Cluster API, CAPM3, IPAM and the BareMetal Operator built from their modules, with BMO's demo hardware and fake workload clusters; docs/providers.md)")
	return cmd
}

func runDev(ctx context.Context, out io.Writer, f devFlags) error {
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
		return runDevBootstrap(ctx, out, f)
	default:
		return fmt.Errorf("--scenario %q: want %s or %s", f.scenario, scenarioMgmt, scenarioBootstrap)
	}
	begin := time.Now()
	p := &devPrinter{out: out, begin: begin}
	if f.verbose {
		ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, nil)))
	} else {
		ctrl.SetLogger(logr.Discard())
	}
	repo, err := testenv.RepoRoot()
	if err != nil {
		return fmt.Errorf("capstan dev runs from a checkout of the Capstan repository (it builds the control plane from e2e/testbin and reads examples/): %w", err)
	}

	envOpts := testenv.Options{
		CRDDirs:  []string{filepath.Join(repo, "manifests", "crds")},
		Progress: &indent{w: out, prefix: "    "},
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
			fmt.Fprintln(out, "stop the control plane:", err)
		}
	}()
	p.step("control plane ready; kubectl --kubeconfig %s get clusterdeployments -A", env.KubeconfigPath)
	// The wait budget starts now: the first build is not the cluster's fault.
	ready := time.Now()

	c, err := client.New(env.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		return err
	}
	if err := ensureDevNamespace(ctx, c); err != nil {
		return err
	}

	root, closeRoot, err := devRoot(ctx, p, repo, f)
	if err != nil {
		return err
	}
	defer closeRoot()

	var simulator *sim.Simulator
	if f.providers == providersSim {
		simOpts := sim.DefaultOptions()
		simOpts.Delays = scaleDelays(simOpts.Delays, f.simSpeed)
		if f.verbose {
			simOpts.Events = func(ev sim.Event) { p.detail("sim: %s", ev) }
		}
		if simulator, err = sim.New(env.Config, simOpts); err != nil {
			return fmt.Errorf("start the simulator: %w", err)
		}
	}
	watcher, err := client.NewWithWatch(env.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		return err
	}
	lcmOpts := sim.DefaultLCMOptions()
	// A StateItem takes about a second at demo pace, so that the rollout's
	// order (managers one by one, then workers) can be watched.
	lcmOpts.ItemDelay = time.Duration(float64(time.Second) / f.simSpeed)
	agent := sim.NewLCMAgent(watcher, lcmOpts)

	opts := reconciler.DefaultOptions()
	opts.Config = env.Config
	opts.Root = root
	opts.MetricsAddr, opts.HealthAddr = "0", "0"
	opts.Reconciler.WaitSlice = 5 * time.Second
	// One daemon on a throw-away control plane: nothing to elect.
	opts.LeaderElection.Enabled = false
	d, err := reconciler.New(opts)
	if err != nil {
		return err
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 3)
	if simulator != nil {
		go func() { errc <- named("simulator", simulator.Run(runCtx)) }()
	}
	go func() { errc <- named("LCM agent simulator", agent.Run(runCtx)) }()
	go func() { errc <- named("reconciler", d.Run(runCtx)) }()
	running := "simulator and reconciler running"
	if f.providers == providersReal {
		running = "real providers and reconciler running"
	}
	if f.cluster != "" {
		p.step("%s; waiting for ClusterDeployment %s/%s", running, devNamespace, f.cluster)
	} else {
		p.step("%s; waiting for every ClusterDeployment under %s", running, f.path)
	}

	watchCtx := runCtx
	if f.exitWhenReady && f.timeout > 0 {
		var cancel context.CancelFunc
		watchCtx, cancel = context.WithDeadline(runCtx, ready.Add(f.timeout))
		defer cancel()
	}
	w := &devWatch{c: c, p: p, only: f.cluster, errc: errc}
	if err := w.untilReady(watchCtx); err != nil {
		return err
	}
	p.step("%s Ready, %s after start", w.names(), time.Since(begin).Round(100*time.Millisecond))
	if f.exitWhenReady {
		return nil
	}
	p.step("still running: push to the repository (or edit --dir) and watch it roll out; Ctrl-C stops")
	return w.keepFollowing(ctx)
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
// examples/ served over HTTP, or the --dir directory read in place.
func devRoot(ctx context.Context, p *devPrinter, repo string, f devFlags) (*reconciler.RootOptions, func(), error) {
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
	srv, err := gitserver.New("", gitserver.Options{Username: "dev", Password: password})
	if err != nil {
		return nil, nil, fmt.Errorf("start the git server: %w", err)
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

// devWatch prints the stage transitions of the demo's deployments.
type devWatch struct {
	c    client.Client
	p    *devPrinter
	only string // one deployment's name, or "" for all
	errc <-chan error

	tracked map[string]*devTracked
}

// devTracked is what the watch last printed of one deployment.
type devTracked struct {
	seen      map[string]string // stage -> state and message printed
	rev       string
	gen       int64
	announced bool // Ready or Stalled at rev, gen printed
	ready     bool
	last      *capstanv1.ClusterDeployment
}

func (w *devWatch) names() string {
	names := make([]string, 0, len(w.tracked))
	for name := range w.tracked {
		names = append(names, name)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// look lists the deployments and prints what changed. It returns an error
// when one is Stalled.
func (w *devWatch) look(ctx context.Context) error {
	list := &capstanv1.ClusterDeploymentList{}
	if err := w.c.List(ctx, list, client.InNamespace(devNamespace)); err != nil {
		return nil // the next tick tries again
	}
	if w.tracked == nil {
		w.tracked = map[string]*devTracked{}
	}
	var stalled []string
	for i := range list.Items {
		cd := &list.Items[i]
		if w.only != "" && cd.Name != w.only {
			continue
		}
		t := w.tracked[cd.Name]
		if t == nil {
			t = &devTracked{seen: map[string]string{}, rev: cd.Status.Revision, gen: cd.Generation}
			w.tracked[cd.Name] = t
		}
		t.last = cd
		if cd.Status.Revision != t.rev || cd.Generation != t.gen {
			if t.rev != "" {
				w.p.step("%s: new revision %s, walking the stages again", cd.Name, formatRevision(cd.Status.Revision))
			}
			t.rev, t.gen, t.announced = cd.Status.Revision, cd.Generation, false
			clear(t.seen)
		}
		prefix := ""
		if w.only == "" {
			prefix = cd.Name
		}
		w.p.transitions(prefix, cd, t.seen)
		t.ready = isDeploymentReady(cd) && cd.Status.Revision == t.rev
		if t.announced {
			continue
		}
		if t.ready {
			t.announced = true
			w.p.summary(prefix, cd)
			w.p.step("%s is Ready at %s", cd.Name, formatRevision(t.rev))
		} else if st := devCondition(cd, capstanv1.ConditionStalled); st != nil && st.Status == metav1.ConditionTrue {
			t.announced = true
			w.p.step("%s stalled at %s: %s", cd.Name, formatRevision(t.rev), st.Message)
			stalled = append(stalled, fmt.Sprintf("%s stalled: %s", cd.Name, st.Message))
		}
	}
	if len(stalled) > 0 {
		return errors.New(strings.Join(stalled, "; "))
	}
	return nil
}

// untilReady follows until every deployment is Ready. It fails when one
// stalls, a component stops, or ctx ends (then naming the stage each
// unready deployment is stuck in).
func (w *devWatch) untilReady(ctx context.Context) error {
	return pollUntil(ctx, w.errc, w.look, func() bool {
		return len(w.tracked) > 0 && !slices.ContainsFunc(slices.Collect(maps.Values(w.tracked)), func(t *devTracked) bool { return !t.ready })
	}, w.stuckError)
}

// devPoll is how often the dev loop looks at the deployments.
const devPoll = 200 * time.Millisecond

// pollUntil calls look every devPoll until done says so (nil), look fails,
// a component stops (its error from errc), or ctx ends (stuck's error).
func pollUntil(ctx context.Context, errc <-chan error, look func(context.Context) error, done func() bool, stuck func(error) error) error {
	tick := time.NewTicker(devPoll)
	defer tick.Stop()
	for {
		if err := look(ctx); err != nil {
			return err
		}
		if done() {
			return nil
		}
		select {
		case <-ctx.Done():
			return stuck(ctx.Err())
		case err := <-errc:
			return err
		case <-tick.C:
		}
	}
}

// keepPolling calls look every devPoll until ctx ends (nil) or a component
// stops (its error). look's errors are not fatal: the next push can fix
// what it reports.
func keepPolling(ctx context.Context, errc <-chan error, look func(context.Context) error) error {
	tick := time.NewTicker(devPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case <-tick.C:
		}
		_ = look(ctx)
	}
}

// ensureDevNamespace creates the namespace the demo's deployments live in.
func ensureDevNamespace(ctx context.Context, c client.Client) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: devNamespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", devNamespace, err)
	}
	return nil
}

// keepFollowing prints every later revision's walk, until ctx ends or a
// component stops. A stalled deployment is reported, not fatal: the next
// push can fix it.
func (w *devWatch) keepFollowing(ctx context.Context) error {
	return keepPolling(ctx, w.errc, w.look)
}

func (w *devWatch) stuckError(cause error) error {
	if errors.Is(cause, context.Canceled) {
		return cause
	}
	if len(w.tracked) == 0 {
		if w.only != "" {
			return fmt.Errorf("%s/%s never appeared: is it committed under --path?", devNamespace, w.only)
		}
		return fmt.Errorf("no ClusterDeployment appeared in %s: is one committed under --path?", devNamespace)
	}
	var stuck []string
	for _, name := range strings.Split(w.names(), ", ") {
		t := w.tracked[name]
		if t.ready {
			continue
		}
		msg := name + " not Ready before the timeout"
		for _, st := range t.last.Status.Stages {
			if st.State != capstanv1.StageReady {
				msg = fmt.Sprintf("%s not Ready before the timeout: stage %s is %s: %s", name, st.Name, st.State, st.Message)
				break
			}
		}
		stuck = append(stuck, msg)
	}
	return errors.New(strings.Join(stuck, "; "))
}

func isDeploymentReady(cd *capstanv1.ClusterDeployment) bool {
	c := devCondition(cd, capstanv1.ConditionReady)
	return c != nil && c.Status == metav1.ConditionTrue && cd.Status.ObservedGeneration == cd.Generation
}

func devCondition(cd *capstanv1.ClusterDeployment, typ string) *metav1.Condition {
	for i := range cd.Status.Conditions {
		if cd.Status.Conditions[i].Type == typ {
			return &cd.Status.Conditions[i]
		}
	}
	return nil
}

func named(what string, err error) error {
	if err == nil || errors.Is(err, context.Canceled) {
		return err
	}
	return fmt.Errorf("%s: %w", what, err)
}

// devPrinter writes the demo's progress: one line per step and per stage
// transition, with the time since start, readable in a log as on a
// terminal.
type devPrinter struct {
	out   io.Writer
	begin time.Time
	// started and took are what the printer saw of each stage: status
	// times have whole seconds, too coarse for stages of a second or two.
	started map[string]time.Time
	took    map[string]time.Duration
}

func (p *devPrinter) stamp() string {
	return fmt.Sprintf("[%6.1fs]", time.Since(p.begin).Seconds())
}

func (p *devPrinter) step(format string, args ...any) {
	fmt.Fprintf(p.out, "%s ▸ %s\n", p.stamp(), fmt.Sprintf(format, args...))
}

func (p *devPrinter) detail(format string, args ...any) {
	fmt.Fprintf(p.out, "%s     %s\n", p.stamp(), fmt.Sprintf(format, args...))
}

// transitions prints the stages whose state or message changed since the
// last look.
func (p *devPrinter) transitions(prefix string, cd *capstanv1.ClusterDeployment, seen map[string]string) {
	if prefix != "" {
		prefix += " "
	}
	for _, st := range cd.Status.Stages {
		key := string(st.State) + "\x00" + st.Message
		if st.State == capstanv1.StageReady {
			// Once Ready, a new message is no new transition.
			key = string(st.State)
		}
		if seen[st.Name] == key || st.State == capstanv1.StagePending {
			continue
		}
		seen[st.Name] = key
		if p.started == nil {
			p.started, p.took = map[string]time.Time{}, map[string]time.Duration{}
		}
		key2 := cd.Name + "/" + st.Name
		if _, ok := p.started[key2]; !ok {
			p.started[key2] = time.Now()
		}
		switch st.State {
		case capstanv1.StageReady:
			p.took[key2] = time.Since(p.started[key2])
			delete(p.started, key2)
			fmt.Fprintf(p.out, "%s   ✓ %s%-24s ready in %s\n", p.stamp(), prefix, st.Name, p.took[key2].Round(100*time.Millisecond))
		default:
			msg := oneLine(strings.TrimSpace(st.Message))
			if msg == "" {
				msg = fmt.Sprintf("started (attempt %d)", st.Attempts)
			}
			fmt.Fprintf(p.out, "%s   … %s%-24s %s\n", p.stamp(), prefix, st.Name, msg)
		}
	}
}

// summary prints each stage's duration, as the printer saw it (to 0.2 s),
// once the deployment is Ready.
func (p *devPrinter) summary(prefix string, cd *capstanv1.ClusterDeployment) {
	title := "STAGE"
	if prefix != "" {
		title = strings.ToUpper(prefix) + " STAGE"
	}
	fmt.Fprintf(p.out, "\n  %-24s %10s %9s\n", title, "DURATION", "ATTEMPTS")
	var total time.Duration
	for _, st := range cd.Status.Stages {
		took := p.took[cd.Name+"/"+st.Name]
		total += took
		fmt.Fprintf(p.out, "  %-24s %10s %9d\n", st.Name, took.Round(100*time.Millisecond), st.Attempts)
	}
	fmt.Fprintf(p.out, "  %-24s %10s\n\n", "total", total.Round(100*time.Millisecond))
}

// indent prefixes every line written through it.
type indent struct {
	w      io.Writer
	prefix string
	mid    bool
}

func (i *indent) Write(b []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line == "" {
			continue
		}
		if !i.mid {
			if _, err := io.WriteString(i.w, i.prefix); err != nil {
				return 0, err
			}
		}
		if _, err := io.WriteString(i.w, line); err != nil {
			return 0, err
		}
		i.mid = !strings.HasSuffix(line, "\n")
	}
	return len(b), nil
}
