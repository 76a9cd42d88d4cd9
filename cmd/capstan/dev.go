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
  capstan dev --exit-when-ready --timeout 10m   # scripted smoke test: exit 0 once Ready`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDev(cmd.Context(), cmd.OutOrStdout(), f)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.dir, "dir", "", "read this directory in place (fsnotify) instead of a git repository of examples/")
	fs.StringVar(&f.path, "path", "clusters/mgmt", "path holding the ClusterDeployments to run, in the repository or --dir")
	fs.StringVar(&f.cluster, "cluster", "mgmt", "the ClusterDeployment whose stages are shown and waited for")
	fs.BoolVar(&f.exitWhenReady, "exit-when-ready", false, "exit 0 once the cluster is Ready; non-zero with the stuck stage's message if it stalls or --timeout passes")
	fs.DurationVar(&f.timeout, "timeout", 15*time.Minute, "with --exit-when-ready, how long to wait for Ready (not counting the first build of the control plane)")
	fs.BoolVar(&f.verbose, "verbose", false, "also print what the simulator does and the daemon's logs")
	fs.Float64Var(&f.simSpeed, "sim-speed", 1, "speed-up of the simulated providers (10 = ten times faster than the demo pace)")
	return cmd
}

func runDev(ctx context.Context, out io.Writer, f devFlags) error {
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

	p.step("control plane: etcd and kube-apiserver on loopback (the first run builds them from source, ~15 min on 2 cores)")
	providers, err := testenv.ProviderCRDDirs(ctx)
	if err != nil {
		return fmt.Errorf("provider CRDs: %w", err)
	}
	env, err := testenv.Start(ctx, testenv.Options{
		CRDDirs:  append([]string{filepath.Join(repo, "manifests", "crds")}, providers...),
		Progress: &indent{w: out, prefix: "    "},
	})
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
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: devNamespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", devNamespace, err)
	}

	root, closeRoot, err := devRoot(ctx, p, repo, f)
	if err != nil {
		return err
	}
	defer closeRoot()

	simOpts := sim.DefaultOptions()
	simOpts.Delays = scaleDelays(simOpts.Delays, f.simSpeed)
	if f.verbose {
		simOpts.Events = func(ev sim.Event) { p.detail("sim: %s", ev) }
	}
	simulator, err := sim.New(env.Config, simOpts)
	if err != nil {
		return fmt.Errorf("start the simulator: %w", err)
	}
	watcher, err := client.NewWithWatch(env.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		return err
	}
	agent := sim.NewLCMAgent(watcher, sim.DefaultLCMOptions())

	opts := reconciler.DefaultOptions()
	opts.Config = env.Config
	opts.Root = root
	opts.MetricsAddr, opts.HealthAddr = "0", "0"
	opts.Reconciler.WaitSlice = 5 * time.Second
	d, err := reconciler.New(opts)
	if err != nil {
		return err
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 3)
	go func() { errc <- named("simulator", simulator.Run(runCtx)) }()
	go func() { errc <- named("LCM agent simulator", agent.Run(runCtx)) }()
	go func() { errc <- named("reconciler", d.Run(runCtx)) }()
	p.step("simulator and reconciler running; waiting for ClusterDeployment %s/%s", devNamespace, f.cluster)

	watchCtx := runCtx
	if f.exitWhenReady && f.timeout > 0 {
		var cancel context.CancelFunc
		watchCtx, cancel = context.WithDeadline(runCtx, ready.Add(f.timeout))
		defer cancel()
	}
	cd, err := followDeployment(watchCtx, c, p, f.cluster, errc)
	if err != nil {
		return err
	}
	p.summary(cd)
	p.step("%s is Ready, %s after start", f.cluster, time.Since(begin).Round(100*time.Millisecond))
	if f.exitWhenReady {
		return nil
	}
	p.step("still running: push to the repository (or edit --dir) and watch it roll out; Ctrl-C stops")
	return keepFollowing(ctx, c, p, f.cluster, cd, errc)
}

// keepFollowing prints every later revision's walk through the stages:
// the revision, each stage transition, and Ready again (or Stalled, with
// why), until ctx ends or a component stops.
func keepFollowing(ctx context.Context, c client.Client, p *devPrinter, name string, ready *capstanv1.ClusterDeployment, errc <-chan error) error {
	rev, gen := ready.Status.Revision, ready.Generation
	seen := map[string]string{}
	announced := true // the Ready state of rev, gen is already printed
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case <-tick.C:
		}
		cd := &capstanv1.ClusterDeployment{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: devNamespace, Name: name}, cd); err != nil {
			continue
		}
		if cd.Status.Revision != rev || cd.Generation != gen {
			rev, gen, announced = cd.Status.Revision, cd.Generation, false
			clear(seen)
			p.step("new revision %s: walking the stages again", shortRevision(rev))
		}
		p.transitions(cd, seen)
		switch stalled := devCondition(cd, capstanv1.ConditionStalled); {
		case announced:
		case isDeploymentReady(cd) && cd.Status.Revision == rev:
			announced = true
			p.step("%s is Ready at %s", name, shortRevision(rev))
		case stalled != nil && stalled.Status == metav1.ConditionTrue:
			announced = true
			p.step("%s stalled at %s: %s", name, shortRevision(rev), stalled.Message)
		}
	}
}

// scaleDelays makes the simulated providers speed times faster.
func scaleDelays(d sim.Delays, speed float64) sim.Delays {
	if speed <= 0 || speed == 1 {
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

// followDeployment prints every stage transition of the deployment until
// it is Ready. It fails when the deployment stalls, a component stops, or
// ctx ends (then with the stage it is stuck in).
func followDeployment(ctx context.Context, c client.Client, p *devPrinter, name string, errc <-chan error) (*capstanv1.ClusterDeployment, error) {
	seen := map[string]string{}
	var last *capstanv1.ClusterDeployment
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		cd := &capstanv1.ClusterDeployment{}
		err := c.Get(ctx, client.ObjectKey{Namespace: devNamespace, Name: name}, cd)
		switch {
		case err == nil:
			last = cd
			p.transitions(cd, seen)
			if isDeploymentReady(cd) {
				return cd, nil
			}
			if st := devCondition(cd, capstanv1.ConditionStalled); st != nil && st.Status == metav1.ConditionTrue {
				return cd, fmt.Errorf("%s stalled: %s", name, st.Message)
			}
		case apierrors.IsNotFound(err):
		case ctx.Err() == nil:
			return nil, err
		}
		select {
		case <-ctx.Done():
			return last, stuckError(name, last, ctx.Err())
		case err := <-errc:
			return last, err
		case <-tick.C:
		}
	}
}

func stuckError(name string, cd *capstanv1.ClusterDeployment, cause error) error {
	if errors.Is(cause, context.Canceled) {
		return cause
	}
	if cd == nil {
		return fmt.Errorf("%s/%s never appeared: is it committed under --path?", devNamespace, name)
	}
	for _, st := range cd.Status.Stages {
		if st.State != capstanv1.StageReady {
			return fmt.Errorf("%s not Ready before the timeout: stage %s is %s: %s", name, st.Name, st.State, st.Message)
		}
	}
	return fmt.Errorf("%s not Ready before the timeout", name)
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
func (p *devPrinter) transitions(cd *capstanv1.ClusterDeployment, seen map[string]string) {
	for _, st := range cd.Status.Stages {
		key := string(st.State) + "\x00" + st.Message
		if seen[st.Name] == key || st.State == capstanv1.StagePending {
			continue
		}
		seen[st.Name] = key
		if p.started == nil {
			p.started, p.took = map[string]time.Time{}, map[string]time.Duration{}
		}
		if _, ok := p.started[st.Name]; !ok {
			p.started[st.Name] = time.Now()
		}
		switch st.State {
		case capstanv1.StageReady:
			p.took[st.Name] = time.Since(p.started[st.Name])
			delete(p.started, st.Name)
			fmt.Fprintf(p.out, "%s   ✓ %-24s ready in %s\n", p.stamp(), st.Name, p.took[st.Name].Round(100*time.Millisecond))
		default:
			msg := oneLine(strings.TrimSpace(st.Message))
			if msg == "" {
				msg = fmt.Sprintf("started (attempt %d)", st.Attempts)
			}
			fmt.Fprintf(p.out, "%s   … %-24s %s\n", p.stamp(), st.Name, msg)
		}
	}
}

// summary prints each stage's duration, as the printer saw it (to 0.2 s),
// once the deployment is Ready.
func (p *devPrinter) summary(cd *capstanv1.ClusterDeployment) {
	fmt.Fprintf(p.out, "\n  %-24s %10s %9s\n", "STAGE", "DURATION", "ATTEMPTS")
	var total time.Duration
	for _, st := range cd.Status.Stages {
		took := p.took[st.Name]
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
