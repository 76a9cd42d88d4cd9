package e2e

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/reconciler/report"
	"github.com/capstan-dev/capstan/sources/git"
)

// statusBranch is where these tests' status commits go.
const statusBranch = capstanv1.DefaultStatusBranch

// repoGit runs the git CLI on a bare repository of srv and returns its
// output; ok is false when git failed (a branch or file that does not
// exist yet).
func repoGit(srv *gitserver.Server, repo string, args ...string) (string, bool) {
	cmd := exec.Command("git", args...)
	cmd.Env = append(os.Environ(), "GIT_DIR="+srv.RepoPath(repo), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err == nil
}

// statusFile reads a deployment's status file at the tip of the status
// branch; nil while there is none.
func statusFile(t testing.TB, srv *gitserver.Server, repo, ns, name string) (*report.File, string) {
	t.Helper()
	out, ok := repoGit(srv, repo, "show", statusBranch+":"+report.Path(ns, name))
	if !ok {
		return nil, ""
	}
	f := &report.File{}
	if err := yaml.Unmarshal([]byte(out), f); err != nil {
		t.Fatalf("status file of %s/%s does not parse: %v\n%s", ns, name, err, out)
	}
	return f, out
}

// waitStatusFile waits until the status branch's file of a deployment
// satisfies cond.
func waitStatusFile(t testing.TB, srv *gitserver.Server, repo, ns, name, what string, cond func(*report.File) bool) (*report.File, string) {
	t.Helper()
	var f *report.File
	var raw string
	waitFor(t, fmt.Sprintf("status file of %s/%s: %s", ns, name, what), func() (bool, error) {
		f, raw = statusFile(t, srv, repo, ns, name)
		if f != nil && cond(f) {
			return true, nil
		}
		return false, fmt.Errorf("status file:\n%s", raw)
	})
	return f, raw
}

func fileStage(f *report.File, name string) report.FileStage {
	for _, s := range f.Stages {
		if s.Name == name {
			return s
		}
	}
	return report.FileStage{}
}

// commitTimes returns the committer times (seconds) of the status
// branch's commits that changed path, newest first.
func commitTimes(t testing.TB, srv *gitserver.Server, repo, path string) []int64 {
	t.Helper()
	out, ok := repoGit(srv, repo, "log", "--format=%ct", statusBranch, "--", path)
	if !ok {
		t.Fatalf("git log of %s: %s", path, out)
	}
	var times []int64
	for _, s := range strings.Fields(out) {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		times = append(times, n)
	}
	return times
}

// assertWindows fails when two commits of path are closer than window:
// at most one commit per deployment per window.
func assertWindows(t testing.TB, srv *gitserver.Server, repo, path string, window time.Duration) []int64 {
	t.Helper()
	times := commitTimes(t, srv, repo, path)
	for i := 0; i+1 < len(times); i++ {
		if gap := time.Duration(times[i]-times[i+1]) * time.Second; gap < window {
			t.Errorf("commits %d and %d of %s are %s apart, inside the %s window (times %v)", i+1, i, path, gap, window, times)
		}
	}
	return times
}

// secretValues returns the values of a Secret that no status file may hold.
func secretValues(t testing.TB, c client.Client, ns, name string) []string {
	t.Helper()
	s := &corev1.Secret{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, s); err != nil {
		t.Fatal(err)
	}
	var out []string
	for k, v := range s.Data {
		// A user name is not secret (and "capstan" is a word of every
		// status file).
		if k != "username" {
			out = append(out, string(v))
		}
	}
	return out
}

// otherWriter commits files of its own to the status branch, as fast as
// it can, until stopped: someone else pushing while Capstan does.
type otherWriter struct {
	srv   *gitserver.Server
	repo  string
	stop  chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	files []string
}

func startOtherWriter(srv *gitserver.Server, repo string) *otherWriter {
	w := &otherWriter{srv: srv, repo: repo, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for i := 0; ; i++ {
			select {
			case <-w.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			path := fmt.Sprintf("notes/%03d.md", i)
			// CommitFiles moves the branch only if nobody else did meanwhile;
			// a lost race is simply tried again with the next file.
			if _, err := srv.Commit(repo, statusBranch, map[string]string{path: "written by hand\n"}, "a note by hand"); err == nil {
				w.mu.Lock()
				w.files = append(w.files, path)
				w.mu.Unlock()
			}
		}
	}()
	return w
}

func (w *otherWriter) finish() []string {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.files
}

// A deployment walks its stages; its status file on capstan/status
// follows, at most one commit per window, while someone else pushes to the
// same branch; the branch it reads gets no commit, and the password of its
// git source, planted in a stage message, never reaches git.
func TestReportStatusCommits(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	files := twoStageFiles("1")
	first, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, "two-stage overlay")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	_, api := startDaemonWith(t, nil, func(o *reconciler.Options) { o.MetricsRegistry = reg })
	secret := gitSecret(t, c, ns)
	const window = 2 * time.Second
	spec := twoStageSpec(url, ns, secret)
	// The stage's message quotes the source's password: a status commit
	// must not.
	spec.Stages[0].ReadyWhen[0].Message = "waiting for the widget controller; token s3cret-token"
	spec.Report = &capstanv1.ReportSpec{GitStatus: &capstanv1.GitStatusReport{Interval: &metav1.Duration{Duration: window}}}
	createDeployment(t, c, ns, "two", spec)

	cd := waitDeployment(t, c, ns, "two", "stage Infra waiting with the planted password in its message", func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "Infra").State == capstanv1.StageInProgress && strings.Contains(stage(cd, "Infra").Message, "s3cret-token")
	})
	f, raw := waitStatusFile(t, gitSrv, ns, ns, "two", "stage Infra in progress", func(f *report.File) bool {
		return fileStage(f, "Infra").State == string(capstanv1.StageInProgress) && strings.Contains(fileStage(f, "Infra").Message, "waiting for the widget controller")
	})
	if f.Revision != cd.Status.Revision || f.Phase != report.PhaseProgressing || fileStage(f, "App").State != string(capstanv1.StagePending) {
		t.Errorf("status file while Infra waits:\n%s\nwant revision %s, Progressing, App Pending", raw, cd.Status.Revision)
	}

	// Someone else pushes to the status branch from now on.
	other := startOtherWriter(gitSrv, ns)
	setWidgetReady(t, c, ns, "infra")
	cd = waitDeployment(t, c, ns, "two", "Ready", isReady)
	// Stopped before the last status is committed, so that a writer
	// faster than Capstan's pushes cannot hold it up.
	theirs := other.finish()
	f, raw = waitStatusFile(t, gitSrv, ns, ns, "two", "Ready", func(f *report.File) bool { return f.Phase == report.PhaseReady })

	for i, st := range cd.Status.Stages {
		got := f.Stages[i]
		if got.Name != st.Name || got.State != string(capstanv1.StageReady) || got.Attempts != st.Attempts ||
			got.StartedAt != st.StartedAt.UTC().Format(time.RFC3339) || got.FinishedAt != st.FinishedAt.UTC().Format(time.RFC3339) {
			t.Errorf("stage %d in the status file = %+v, want %s Ready as in status (%+v)", i, got, st.Name, st)
		}
	}
	if f.Revision != "main@sha1:"+first || f.ObservedGeneration != cd.Generation {
		t.Errorf("status file revision %s generation %d, want main@sha1:%s and %d", f.Revision, f.ObservedGeneration, first, cd.Generation)
	}
	if len(f.Conditions) == 0 || f.Conditions[0].Type != capstanv1.ConditionReady || f.Conditions[0].Status != "True" {
		t.Errorf("status file conditions %+v, want Ready=True first", f.Conditions)
	}

	// Nothing of the Secret reached any version of the file.
	history, _ := repoGit(gitSrv, ns, "log", "-p", statusBranch, "--", report.Path(ns, "two"))
	for _, v := range secretValues(t, c, ns, secret) {
		if strings.Contains(history, v) {
			t.Errorf("a value of Secret %s is in the history of the status file", secret)
		}
	}
	if !strings.Contains(history, "token ***") {
		t.Errorf("the status file's history never showed the scrubbed stage message:\n%s", history)
	}

	// Everything the other writer pushed is still there.
	tree, _ := repoGit(gitSrv, ns, "ls-tree", "-r", "--name-only", statusBranch)
	for _, p := range theirs {
		if !strings.Contains(tree, p) {
			t.Errorf("%s, pushed by someone else, is gone from %s", p, statusBranch)
		}
	}
	if len(theirs) == 0 {
		t.Error("the other writer pushed nothing; the test did not race")
	}

	times := assertWindows(t, gitSrv, ns, report.Path(ns, "two"), window)
	// The branch Capstan reads never got a commit.
	if tip, _ := repoGit(gitSrv, ns, "rev-parse", gitserver.DefaultBranch); tip != first {
		t.Errorf("main moved from %s to %s", first, tip)
	}
	if r := eventReasons(t, c, ns, "two"); r["StatusCommitRejected"] > 0 {
		t.Errorf("events %v, want no refusal", r)
	}
	n, _ := repoGit(gitSrv, ns, "rev-list", "--count", statusBranch)
	t.Logf("%d status writes, %d commits of the status file (window %s); %d notes by another writer kept; %s commits on the branch; metrics: %s",
		api.total("PATCH", "/clusterdeployments/two/status"), len(times), window, len(theirs), n, reportMetrics(t, reg))
}

// `capstan run --status-branch`: every deployment of the root source
// commits its status to the root repository, with the root's credentials.
func TestReportRootStatusBranch(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	files := rootCluster("alpha", ns)
	for k, v := range rootCluster("beta", ns) {
		files[k] = v
	}
	first, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, "add alpha and beta")
	if err != nil {
		t.Fatal(err)
	}
	startDaemonWith(t, &reconciler.RootOptions{
		URL: url, Branch: "main", Path: "clusters", Namespace: ns, Interval: 500 * time.Millisecond,
		Auth: git.Auth{Username: "capstan", Password: "s3cret-token"},
	}, func(o *reconciler.Options) {
		o.Report = reconciler.ReportOptions{StatusBranch: statusBranch, Interval: time.Second, AuthorName: "Capstan E2E", AuthorEmail: "e2e@capstan.invalid"}
	})
	for _, name := range []string{"alpha", "beta"} {
		cd := waitDeployment(t, c, ns, name, "Ready", isReady)
		f, raw := waitStatusFile(t, gitSrv, ns, ns, name, "Ready", func(f *report.File) bool { return f.Phase == report.PhaseReady })
		if f.Revision != cd.Status.Revision || len(f.Stages) != len(cd.Status.Stages) {
			t.Errorf("status file of %s:\n%s\nwant revision %s and %d stages", name, raw, cd.Status.Revision, len(cd.Status.Stages))
		}
		assertWindows(t, gitSrv, ns, report.Path(ns, name), time.Second)
	}
	if who, _ := repoGit(gitSrv, ns, "log", "-1", "--format=%an <%ae>", statusBranch); who != "Capstan E2E <e2e@capstan.invalid>" {
		t.Errorf("status commits are authored by %q", who)
	}
	if tip, _ := repoGit(gitSrv, ns, "rev-parse", gitserver.DefaultBranch); tip != first {
		t.Errorf("main moved from %s to %s", first, tip)
	}
	if n, _ := repoGit(gitSrv, ns, "rev-list", "--count", statusBranch); n == "0" {
		t.Error("no status commit")
	}
}

// A status branch that is the branch a deployment reads is refused: by
// the API for a deployment with its own git source, by the reporter (an
// event, no commit) for one of the root source.
func TestReportRefusesTheBranchItReads(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	spec := twoStageSpec(url, ns, "git-auth")
	spec.Report = &capstanv1.ReportSpec{GitStatus: &capstanv1.GitStatusReport{Branch: "main"}}
	err = c.Create(context.Background(), &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Name: "self", Namespace: ns}, Spec: spec})
	if err == nil || !strings.Contains(err.Error(), "is the branch spec.source.git reads") {
		t.Errorf("create a deployment whose status branch is its source branch = %v, want the API to refuse it", err)
	}

	files := rootCluster("alpha", ns)
	files["clusters/alpha/clusterdeployment.yaml"] += "  report: {gitStatus: {branch: main}}\n"
	first, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, "add alpha, reporting to main")
	if err != nil {
		t.Fatal(err)
	}
	startDaemon(t, &reconciler.RootOptions{
		URL: url, Branch: "main", Path: "clusters", Namespace: ns, Interval: 500 * time.Millisecond,
		Auth: git.Auth{Username: "capstan", Password: "s3cret-token"},
	})
	waitDeployment(t, c, ns, "alpha", "Ready", isReady)
	waitFor(t, "a StatusCommitRejected event on alpha", func() (bool, error) {
		return eventReasons(t, c, ns, "alpha")["StatusCommitRejected"] > 0, nil
	})
	if tip, _ := repoGit(gitSrv, ns, "rev-parse", gitserver.DefaultBranch); tip != first {
		t.Errorf("main moved from %s to %s", first, tip)
	}
}

// Status commits over ssh: the source and the status branch of one
// repository, through one Secret with identity and known_hosts.
func TestReportOverSSH(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	// The suite's server speaks http; this test starts one with ssh.
	srv, err := gitserver.New("", gitserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	knownHosts, err := srv.StartSSH(ctx, pub)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.CreateRepo("infra"); err != nil {
		t.Fatal(err)
	}
	first, err := srv.Commit("infra", gitserver.DefaultBranch, twoStageFiles("1"), "two-stage overlay")
	if err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "git-ssh", Namespace: ns},
		Data:       map[string][]byte{"identity": pem.EncodeToMemory(block), "known_hosts": knownHosts},
	}
	if err := c.Create(context.Background(), secret); err != nil {
		t.Fatal(err)
	}
	startDaemon(t, nil)
	spec := twoStageSpec(srv.SSHURL("infra"), ns, secret.Name)
	spec.Report = &capstanv1.ReportSpec{GitStatus: &capstanv1.GitStatusReport{Interval: &metav1.Duration{Duration: time.Second}}}
	createDeployment(t, c, ns, "over-ssh", spec)
	setWidgetReadyWhenItExists(t, c, ns, "infra")
	waitDeployment(t, c, ns, "over-ssh", "Ready", isReady)
	waitStatusFile(t, srv, "infra", ns, "over-ssh", "Ready", func(f *report.File) bool { return f.Phase == report.PhaseReady })
	if tip, _ := repoGit(srv, "infra", "rev-parse", gitserver.DefaultBranch); tip != first {
		t.Errorf("main moved from %s to %s", first, tip)
	}
	if srv.Requests() != 0 {
		t.Errorf("%d http requests to an ssh-only repository", srv.Requests())
	}
}

// setWidgetReadyWhenItExists plays the widget controller as soon as the
// stage applied the Widget.
func setWidgetReadyWhenItExists(t testing.TB, c client.Client, ns, name string) {
	t.Helper()
	waitFor(t, "Widget "+ns+"/"+name, func() (bool, error) {
		return object(t, c, widgetGVK, ns, name) != nil, nil
	})
	setWidgetReady(t, c, ns, name)
}

// reportMetrics prints the report families of reg.
func reportMetrics(t testing.TB, reg *prometheus.Registry) string {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "capstan_report_") {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := ""
			for _, l := range m.GetLabel() {
				labels += l.GetName() + "=" + l.GetValue()
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			out = append(out, fmt.Sprintf("%s{%s}=%g", f.GetName(), labels, v))
		}
	}
	return strings.Join(out, " ")
}

// A status written just before the daemon stops, inside its window, is
// committed by the next daemon: it looks at every deployment when it
// starts leading.
func TestReportResumesAfterRestart(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, twoStageFiles("1"), "two-stage overlay"); err != nil {
		t.Fatal(err)
	}
	// A window longer than the test: after its first commit, the first
	// daemon commits nothing more of this deployment.
	d, _ := startDaemonWith(t, nil, func(o *reconciler.Options) { o.Report.Interval = time.Hour })
	spec := twoStageSpec(url, ns, gitSecret(t, c, ns))
	spec.Report = &capstanv1.ReportSpec{GitStatus: &capstanv1.GitStatusReport{}}
	createDeployment(t, c, ns, "two", spec)
	waitStatusFile(t, gitSrv, ns, ns, "two", "stage Infra in progress", func(f *report.File) bool {
		return fileStage(f, "Infra").State == string(capstanv1.StageInProgress)
	})
	setWidgetReady(t, c, ns, "infra")
	waitDeployment(t, c, ns, "two", "Ready", isReady)
	if f, raw := statusFile(t, gitSrv, ns, ns, "two"); f.Phase == report.PhaseReady {
		t.Fatalf("the status file is Ready inside a one-hour window:\n%s", raw)
	}
	stopDaemon(d)

	startDaemonWith(t, nil, func(o *reconciler.Options) { o.Report.Interval = time.Second })
	waitStatusFile(t, gitSrv, ns, ns, "two", "Ready, committed by the next daemon", func(f *report.File) bool { return f.Phase == report.PhaseReady })
	if n := len(commitTimes(t, gitSrv, ns, report.Path(ns, "two"))); n != 2 {
		t.Errorf("%d commits of the status file, want 2 (one per daemon)", n)
	}
}
