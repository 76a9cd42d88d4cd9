package report

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/sources/git"
)

// startReporter runs a Reporter for deployments of the root repository
// repo until the test ends.
func startReporter(t *testing.T, repo string, tune func(*Options)) (*Reporter, *events.FakeRecorder) {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts := Options{
		Interval: 2 * time.Second, Settle: 200 * time.Millisecond, Registerer: reg,
		Root: &Root{URL: server.HTTPURL(repo), Branch: "main", StatusBranch: "capstan/status", Namespaces: []string{"fleet"},
			Auth: git.Auth{Username: testUser, Password: testPassword}},
	}
	if tune != nil {
		tune(&opts)
	}
	rec := events.NewFakeRecorder(100)
	r, err := New(opts, nil, rec)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("reporter: %v", err)
		}
	})
	return r, rec
}

func deployment(name string, stage int) *capstanv1.ClusterDeployment {
	cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "fleet", Generation: 1}}
	cd.Status.Revision = "main@sha1:0123456789abcdef0123456789abcdef01234567"
	cd.Status.CurrentStage = "Stage" + strconv.Itoa(stage)
	for i := range 40 {
		st := capstanv1.StageStatus{Name: "Stage" + strconv.Itoa(i), State: capstanv1.StagePending}
		switch {
		case i < stage:
			st.State = capstanv1.StageReady
		case i == stage:
			st.State, st.Attempts = capstanv1.StageInProgress, 1
		}
		cd.Status.Stages = append(cd.Status.Stages, st)
	}
	return cd
}

// waitBranch waits until the status branch holds want at path.
func waitBranch(t *testing.T, repo, path, want string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		out, err := gitTry(repo, "show", "capstan/status:"+path)
		if err == nil && strings.Contains(out, want) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	out, _ := gitTry(repo, "show", "capstan/status:"+path)
	t.Fatalf("the status branch's %s does not hold %q after a minute:\n%s", path, want, out)
}

// commitTimes returns the times of the commits that changed path, newest first.
func commitTimes(t *testing.T, repo, path string) []int64 {
	t.Helper()
	var out []int64
	for _, s := range strings.Fields(gitOut(t, repo, "log", "--format=%ct", "capstan/status", "--", path)) {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

// A deployment that walks 40 stages, one status every 50 ms, gets at most
// one commit per 2 s window, and the branch ends with its last status.
func TestReporterCoalescesTransitions(t *testing.T) {
	repo := newRepo(t)
	r, _ := startReporter(t, repo, nil)
	for stage := range 40 {
		r.Notify(deployment("east", stage))
		time.Sleep(50 * time.Millisecond) // the pace of the walk, not a wait for the reporter
	}
	waitBranch(t, repo, "status/fleet/east.yaml", "currentStage: Stage39")
	times := commitTimes(t, repo, "status/fleet/east.yaml")
	for i := 0; i+1 < len(times); i++ {
		if gap := times[i] - times[i+1]; gap < 2 {
			t.Errorf("commits %d and %d of the file are %ds apart, inside the 2s window (times %v)", i+1, i, gap, times)
		}
	}
	if len(times) >= 40 {
		t.Errorf("40 statuses made %d commits", len(times))
	}
	// The branch shows a commit before its push returns and is counted.
	committed := r.metrics.commits.WithLabelValues(resultCommitted)
	waitCounter(t, committed, float64(len(times)), "every commit of the branch counted")
	if got := counterValue(t, committed); int(got) != len(times) {
		t.Errorf("%s{result=committed} = %v, want %d", CommitsTotal, got, len(times))
	}
	t.Logf("40 statuses over 2s: %d commits", len(times))
}

// Deployments of one repository that change together share a commit.
func TestReporterBatchesARepository(t *testing.T) {
	repo := newRepo(t)
	r, _ := startReporter(t, repo, func(o *Options) { o.Settle = time.Second })
	for _, name := range []string{"a", "b", "c"} {
		r.Notify(deployment(name, 1))
	}
	waitBranch(t, repo, "status/fleet/c.yaml", "currentStage: Stage1")
	if got := gitOut(t, repo, "rev-list", "--count", "capstan/status"); got != "1" {
		t.Errorf("three deployments notified together made %s commits, want 1", got)
	}
	msg := gitOut(t, repo, "log", "-1", "--format=%B", "capstan/status")
	if !strings.Contains(msg, "status: 3 deployments") || !strings.Contains(msg, "fleet/b: Progressing (stage Stage1)") {
		t.Errorf("commit message:\n%s", msg)
	}
}

// The branch a deployment reads is never written: the status of such a
// deployment is refused with an event, and nothing is pushed.
func TestReporterRefusesABranchSomeoneReads(t *testing.T) {
	repo := newRepo(t)
	r, rec := startReporter(t, repo, nil)
	cd := func(name, reads, reportsTo string) *capstanv1.ClusterDeployment {
		cd := deployment(name, 1)
		// The same repository, written differently.
		cd.Spec.Source = &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: server.HTTPURL(repo) + "/", Ref: capstanv1.GitRef{Branch: reads}}}
		if reportsTo != "" {
			cd.Spec.Report = &capstanv1.ReportSpec{GitStatus: &capstanv1.GitStatusReport{Branch: reportsTo}}
		}
		return cd
	}
	tests := []struct {
		cd   *capstanv1.ClusterDeployment
		want string
	}{
		{cd("self", "capstan/reads", "capstan/reads"), `branch "capstan/reads" is the branch the deployment reads`},
		{cd("to-root", "staging", "main"), `status branch "main" is the branch the root source reads`},
		{cd("to-other", "main", "release"), `status branch "release" is the branch ClusterDeployment fleet/reader reads`},
	}
	r.Notify(cd("reader", "release", ""))
	for _, tt := range tests {
		r.Notify(tt.cd)
		select {
		case e := <-rec.Events:
			if !strings.HasPrefix(e, "Warning StatusCommitRejected") || !strings.Contains(e, tt.want) {
				t.Errorf("%s: event %q, want a StatusCommitRejected saying %q", tt.cd.Name, e, tt.want)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s: no event after a minute", tt.cd.Name)
		}
	}
	// A new status of a refused deployment is refused again, without a
	// second event at the same generation.
	again := cd("self", "capstan/reads", "capstan/reads")
	again.Status.CurrentStage = "Stage2"
	r.Notify(again)
	waitCounter(t, r.metrics.commits.WithLabelValues(resultRejected), 4, "a second status of a refused deployment refused")
	select {
	case e := <-rec.Events:
		t.Errorf("a second event at the same generation: %q", e)
	default:
	}
	if out, _ := gitTry(repo, "branch", "--list"); out != "* main" {
		t.Errorf("branches after refused statuses: %q, want main only", out)
	}
	if got := gitOut(t, repo, "rev-list", "--count", "main"); got != "1" {
		t.Errorf("main has %s commits, want the initial one only", got)
	}
	if got := counterValue(t, r.metrics.commits.WithLabelValues(resultRejected)); got != 4 {
		t.Errorf("%s{result=rejected} = %v, want 4", CommitsTotal, got)
	}
}

func TestNewRefusesTheRootBranch(t *testing.T) {
	_, err := New(Options{Root: &Root{URL: "https://git.example/infra.git", Branch: "main", StatusBranch: "main"}}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "is the branch the root source reads") {
		t.Errorf("New = %v, want a refusal of the branch the root source reads", err)
	}
}

func gitTry(repo string, args ...string) (string, error) {
	out, err := gitCmd(repo, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// waitCounter waits up to a minute until c counts at least n.
func waitCounter(t *testing.T, c prometheus.Counter, n float64, what string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for counterValue(t, c) < n {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after a minute waiting for %s (%v counted, want %v)", what, counterValue(t, c), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	m := &dto.Metric{}
	if err := c.Write(m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
