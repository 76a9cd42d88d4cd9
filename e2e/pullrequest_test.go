package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/giteaserver"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/reconciler/report"
	"github.com/capstan-dev/capstan/reconciler/report/forge"
)

// One real Gitea for the suite, started by the first test that needs it
// and stopped by TestMain (stopGitea).
var (
	giteaOnce sync.Once
	giteaSrv  *giteaserver.Server
	giteaErr  error
)

// giteaSecrets makes a token for Capstan on s and writes the two Secrets
// the pull-request tests' deployments read into ns: "git-auth" (clone
// over http) and "forge-token" (comments and commit statuses). It returns
// the token, for the tests that look for it where it must not be.
func giteaSecrets(t *testing.T, s *giteaserver.Server, c client.Client, ns string) string {
	t.Helper()
	ctx := context.Background()
	token, err := s.NewToken(ctx, "capstan-"+ns, "write:issue", "write:repository")
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]map[string]string{
		"git-auth":    {"username": giteaserver.AdminUser, "password": s.Token()},
		"forge-token": {"token": token},
	} {
		if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, StringData: data}); err != nil {
			t.Fatal(err)
		}
	}
	return token
}

// realGitea returns the suite's Gitea. A missing binary fails the test
// with the error that says to run `make gitea`; it is never skipped.
func realGitea(t *testing.T) *giteaserver.Server {
	t.Helper()
	giteaOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		giteaSrv, giteaErr = giteaserver.Start(ctx, giteaserver.Options{})
	})
	if giteaErr != nil {
		t.Fatal(giteaErr)
	}
	return giteaSrv
}

// stopGitea stops the suite's Gitea if a test started it.
func stopGitea() {
	if giteaSrv != nil {
		if err := giteaSrv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop gitea:", err)
		}
	}
}

var machineDeploymentGVK = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "MachineDeployment"}

// Values planted in the overlay's Secret: no comment, commit status, status
// commit or log line may hold them.
const (
	plantedFirst  = "pr-planted-Vx93-first-value"
	plantedSecond = "pr-planted-Qm27-second-value"
)

// edgeFiles is a small cluster overlay: settings and a Secret in stage
// Config, the workers' MachineDeployment (the real Cluster API CRD) in
// stage Workers.
func edgeFiles(workers int, apiKey string) map[string]string {
	return map[string]string{
		"clusters/edge/kustomization.yaml": `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [config.yaml, workers.yaml]
`,
		"clusters/edge/config.yaml": fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: edge-settings
  namespace: ${NS}
  labels: {capstan.dev/stage: Config}
data: {workers: "%d", podCIDR: 10.233.0.0/16}
---
apiVersion: v1
kind: Secret
metadata:
  name: edge-credentials
  namespace: ${NS}
  labels: {capstan.dev/stage: Config}
stringData: {apiKey: %s}
`, workers, apiKey),
		"clusters/edge/workers.yaml": fmt.Sprintf(`apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineDeployment
metadata:
  name: edge-workers
  namespace: ${NS}
  labels: {capstan.dev/stage: Workers, cluster.x-k8s.io/cluster-name: edge}
spec:
  clusterName: edge
  replicas: %d
  selector:
    matchLabels: {cluster.x-k8s.io/deployment-name: edge-workers}
  template:
    metadata:
      labels: {cluster.x-k8s.io/deployment-name: edge-workers}
    spec:
      clusterName: edge
      version: v1.35.4
      bootstrap:
        configRef: {apiGroup: bootstrap.cluster.x-k8s.io, kind: KubeadmConfigTemplate, name: edge-workers}
      infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: Metal3MachineTemplate, name: edge-workers}
`, workers),
	}
}

func edgeSpec(url, ns, gitSecret, tokenSecret, baseURL string) capstanv1.ClusterDeploymentSpec {
	return capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
			URL: url, Ref: capstanv1.GitRef{Branch: "main"},
			SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret},
		}},
		Path:       "clusters/edge",
		Substitute: map[string]string{"NS": ns},
		Interval:   &metav1.Duration{Duration: 500 * time.Millisecond},
		Stages: []capstanv1.StageSpec{
			{Name: "Config"},
			{Name: "Workers", ReadyWhen: []capstanv1.ReadinessCheck{{
				Kind:    "MachineDeployment",
				CEL:     "has(object.status) && has(object.status.readyReplicas) && object.status.readyReplicas == object.spec.replicas",
				Message: "waiting for the workers to join",
			}}},
		},
		Report: &capstanv1.ReportSpec{
			GitStatus: &capstanv1.GitStatusReport{Interval: &metav1.Duration{Duration: time.Second}},
			PullRequests: &capstanv1.PullRequestReport{
				Provider: capstanv1.ForgeGitea, BaseURL: baseURL,
				SecretRef: capstanv1.LocalObjectReference{Name: tokenSecret},
				Interval:  &metav1.Duration{Duration: time.Second},
			},
		},
	}
}

// setWorkersReady plays the Cluster API controller: all replicas joined.
// It waits until the stage applied the given number of replicas.
func setWorkersReady(t *testing.T, c client.Client, ns string, replicas int64) {
	t.Helper()
	var md *unstructured.Unstructured
	waitFor(t, fmt.Sprintf("MachineDeployment %s/edge-workers with %d replicas", ns, replicas), func() (bool, error) {
		md = object(t, c, machineDeploymentGVK, ns, "edge-workers")
		if md == nil {
			return false, nil
		}
		n, _, _ := unstructuredInt(md.Object, "spec", "replicas")
		return n == replicas, nil
	})
	patch := client.RawPatch("application/merge-patch+json", fmt.Appendf(nil, `{"status":{"replicas":%d,"readyReplicas":%d}}`, replicas, replicas))
	if err := c.Status().Patch(context.Background(), md, patch); err != nil {
		t.Fatal(err)
	}
}

func unstructuredInt(obj map[string]any, path ...string) (int64, bool, error) {
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return 0, false, nil
		}
		cur = m[p]
	}
	n, ok := cur.(int64)
	return n, ok, nil
}

// ourComments returns the comments on a pull request that Capstan keeps.
func ourComments(t *testing.T, s *giteaserver.Server, repo giteaserver.Repo, n int64) []giteaserver.Comment {
	t.Helper()
	cs, err := s.Comments(context.Background(), repo, n)
	if err != nil {
		t.Fatal(err)
	}
	var out []giteaserver.Comment
	for _, c := range cs {
		if strings.HasPrefix(c.Body, forge.Marker(report.PlanMarkerKey)) {
			out = append(out, c)
		}
	}
	return out
}

// waitComment waits until the pull request has one Capstan comment that
// satisfies cond, failing at once if there are ever two.
func waitComment(t *testing.T, s *giteaserver.Server, repo giteaserver.Repo, n int64, what string, cond func(string) bool) giteaserver.Comment {
	t.Helper()
	var got giteaserver.Comment
	waitFor(t, fmt.Sprintf("the comment on pull request %d: %s", n, what), func() (bool, error) {
		cs := ourComments(t, s, repo, n)
		if len(cs) > 1 {
			t.Fatalf("%d Capstan comments on pull request %d, want one", len(cs), n)
		}
		if len(cs) == 1 && cond(cs[0].Body) {
			got = cs[0]
			return true, nil
		}
		if len(cs) == 1 {
			return false, fmt.Errorf("comment:\n%s", cs[0].Body)
		}
		return false, nil
	})
	return got
}

// waitStatus waits until the newest commit status of a context on sha has
// state.
func waitStatus(t *testing.T, s *giteaserver.Server, repo giteaserver.Repo, sha, context_, state string) giteaserver.Status {
	t.Helper()
	var got giteaserver.Status
	waitFor(t, fmt.Sprintf("commit status %s of %s: %s", context_, sha, state), func() (bool, error) {
		sts, err := s.CommitStatuses(context.Background(), repo, sha)
		if err != nil {
			return false, err
		}
		for _, st := range sts {
			if st.Context == context_ {
				got = st
				return st.State == state, fmt.Errorf("newest: %+v", st)
			}
		}
		return false, nil
	})
	return got
}

// normalise makes a comment comparable with its golden file: commits,
// the test's namespace and the pull request number vary from run to run.
func normalise(body, ns string) string {
	body = regexp.MustCompile(`[0-9a-f]{40}`).ReplaceAllString(body, "<sha>")
	body = strings.ReplaceAll(body, ns, "<ns>")
	return regexp.MustCompile(`refs/pull/\d+/head|#\d+`).ReplaceAllStringFunc(body, func(s string) string {
		if strings.HasPrefix(s, "#") {
			return "#<n>"
		}
		return "refs/pull/<n>/head"
	})
}

// compareGolden compares got with testdata/pullrequest/<name>;
// CAPSTAN_UPDATE_GOLDEN=1 rewrites the file.
func compareGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "pullrequest", name)
	if os.Getenv("CAPSTAN_UPDATE_GOLDEN") != "" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (CAPSTAN_UPDATE_GOLDEN=1 writes it)", err)
	}
	if got != string(want) {
		t.Errorf("comment differs from %s (CAPSTAN_UPDATE_GOLDEN=1 rewrites it):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// logBuffer records every log line of a daemon.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		fmt.Fprintf(&l.buf, "%s %s\n", prefix, args)
	}, funcr.Options{Verbosity: 2})
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// A pull request against the branch a deployment reads gets one comment
// with the plan; a second push edits it; a broken pull request gets its
// error there and nothing is applied; after the merge the comment and a
// commit status on the merge commit follow the rollout to Ready, the
// status branch holds the status commits and main only what people
// pushed. No value of a Secret reaches a comment, a status or a log line.
func TestPullRequestPlanAndRollout(t *testing.T) {
	s := realGitea(t)
	ctx := context.Background()
	c := newClient(t)
	ns := newNamespace(t)
	repo, err := s.CreateRepo(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, repo, "main", edgeFiles(2, plantedFirst), "the edge cluster"); err != nil {
		t.Fatal(err)
	}
	token := giteaSecrets(t, s, c, ns)
	logs := &logBuffer{}
	startDaemonWith(t, nil, func(o *reconciler.Options) {
		o.Report.Interval = time.Second
		o.Logger = logs.logger()
	})
	createDeployment(t, c, ns, "edge", edgeSpec(s.CloneURL(repo), ns, "git-auth", "forge-token", s.URL()))
	waitDeployment(t, c, ns, "edge", "stage Workers waiting", func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "Workers").State == capstanv1.StageInProgress
	})
	setWorkersReady(t, c, ns, 2)
	first := waitDeployment(t, c, ns, "edge", "Ready", isReady)

	// A pull request that scales the workers and rotates the Secret.
	head, err := s.Commit(ctx, repo, "scale", edgeFiles(3, plantedSecond), "Scale edge to 3 workers")
	if err != nil {
		t.Fatal(err)
	}
	opened := time.Now()
	pr, err := s.OpenPullRequest(ctx, repo, "scale", "main", "Scale edge to 3 workers")
	if err != nil {
		t.Fatal(err)
	}
	comment := waitComment(t, s, repo, pr.Number, "the plan of the first head", func(b string) bool { return strings.Contains(b, head) })
	toComment := time.Since(opened)
	compareGolden(t, "plan.md", normalise(comment.Body, ns))

	// A second push: the same comment is edited.
	pushed := time.Now()
	head2, err := s.Commit(ctx, repo, "scale", edgeFiles(4, plantedSecond), "Four workers, rather")
	if err != nil {
		t.Fatal(err)
	}
	edited := waitComment(t, s, repo, pr.Number, "the plan of the second head", func(b string) bool {
		return strings.Contains(b, head2) && strings.Contains(b, "spec.replicas: 2 -> 4")
	})
	toEdit := time.Since(pushed)
	if edited.ID != comment.ID {
		t.Errorf("the second push made comment %d, want comment %d edited", edited.ID, comment.ID)
	}

	// `capstan diff --pr` prints the same plan locally, exit code 1.
	cli := exec.Command(capstanBinary(t), "diff", "--pr", fmt.Sprint(pr.Number), "--deployment", ns+"/edge",
		"--token-env", "E2E_FORGE_TOKEN", "--kubeconfig", env.KubeconfigPath)
	cli.Env = append(os.Environ(), "E2E_FORGE_TOKEN="+token)
	out, err := cli.CombinedOutput()
	if code := cli.ProcessState.ExitCode(); code != 1 || !strings.Contains(string(out), "spec.replicas: 2 -> 4") ||
		!strings.Contains(string(out), "refs/pull/"+fmt.Sprint(pr.Number)+"/head@sha1:"+head2) {
		t.Errorf("capstan diff --pr: exit %d (%v), want 1 with the plan of %s:\n%s", code, err, head2, out)
	}
	cliOut := string(out)

	// A broken overlay: the error, with its file, goes in its comment.
	broken := edgeFiles(5, plantedSecond)
	broken["clusters/edge/kustomization.yaml"] = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [config.yaml, workers.yaml, missing.yaml]\n"
	if _, err := s.Commit(ctx, repo, "broken", broken, "A broken overlay"); err != nil {
		t.Fatal(err)
	}
	bad, err := s.OpenPullRequest(ctx, repo, "broken", "main", "A broken overlay")
	if err != nil {
		t.Fatal(err)
	}
	badComment := waitComment(t, s, repo, bad.Number, "the render error", func(b string) bool {
		return strings.Contains(b, "cannot be applied") && strings.Contains(b, "missing.yaml")
	})
	compareGolden(t, "broken.md", normalise(badComment.Body, ns))
	if cd := getDeployment(t, c, ns, "edge"); cd.Status.Revision != first.Status.Revision {
		t.Errorf("the deployment moved to %s while only pull requests were open", cd.Status.Revision)
	}
	if md := object(t, c, machineDeploymentGVK, ns, "edge-workers"); md != nil {
		if n, _, _ := unstructuredInt(md.Object, "spec", "replicas"); n != 2 {
			t.Errorf("the MachineDeployment has %d replicas before the merge, want 2", n)
		}
	}

	// Another pull request on the same field, open across the merge.
	headFive, err := s.Commit(ctx, repo, "five", edgeFiles(5, plantedSecond), "Five workers")
	if err != nil {
		t.Fatal(err)
	}
	five, err := s.OpenPullRequest(ctx, repo, "five", "main", "Five workers")
	if err != nil {
		t.Fatal(err)
	}
	fiveComment := waitComment(t, s, repo, five.Number, "the plan against the first revision", func(b string) bool {
		return strings.Contains(b, headFive) && strings.Contains(b, "spec.replicas: 2 -> 5") &&
			strings.Contains(b, "Compared with the clusters as `"+first.Status.Revision+"` left them (Ready).")
	})

	// The merge rolls out; the comment and the commit status follow it.
	merge, err := s.MergePullRequest(ctx, repo, pr.Number)
	if err != nil {
		t.Fatal(err)
	}
	statusContext := "capstan/" + ns + "/edge"
	waitDeployment(t, c, ns, "edge", "the merge rolling out, stage Workers waiting", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.Revision == "main@sha1:"+merge && stage(cd, "Workers").State == capstanv1.StageInProgress
	})
	pending := waitStatus(t, s, repo, merge, statusContext, "pending")
	// The stage may have counted its objects by the time the comment is
	// written ("InProgress, 0/1 objects ready"), or not yet.
	waitComment(t, s, repo, pr.Number, "the rollout in progress", func(b string) bool {
		return strings.Contains(b, "Capstan rollout of #") && strings.Contains(b, "| `Workers` | InProgress")
	})
	setWorkersReady(t, c, ns, 4)
	waitDeployment(t, c, ns, "edge", "Ready at the merge", func(cd *capstanv1.ClusterDeployment) bool {
		return isReady(cd) && cd.Status.Revision == "main@sha1:"+merge
	})
	readyAt := time.Now()
	success := waitStatus(t, s, repo, merge, statusContext, "success")
	toSuccess := time.Since(readyAt)
	final := waitComment(t, s, repo, pr.Number, "the rollout Ready", func(b string) bool {
		return strings.Contains(b, ":white_check_mark:") && strings.Contains(b, "| `Workers` | Ready |") && strings.Contains(b, head2)
	})
	if final.ID != comment.ID {
		t.Errorf("the rollout went to comment %d, want comment %d", final.ID, comment.ID)
	}
	if !strings.HasPrefix(success.TargetURL, pr.URL) {
		t.Errorf("the commit status links to %q, want the comment on %s", success.TargetURL, pr.URL)
	}
	// The open pull request is planned again against what the merge left:
	// its comment is edited, the broken one's (the same error) is not.
	replanned := waitComment(t, s, repo, five.Number, "the plan against the merge", func(b string) bool {
		return strings.Contains(b, headFive) && strings.Contains(b, "spec.replicas: 4 -> 5") &&
			strings.Contains(b, "Compared with the clusters as `main@sha1:"+merge+"` left them (Ready).")
	})
	toReplan := time.Since(readyAt)
	if replanned.ID != fiveComment.ID {
		t.Errorf("the plan after the merge went to comment %d, want comment %d edited", replanned.ID, fiveComment.ID)
	}
	if now := ourComments(t, s, repo, bad.Number); len(now) != 1 || now[0].Body != badComment.Body {
		t.Errorf("the broken pull request's comment changed after the merge:\n%v\n--- was\n%s", now, badComment.Body)
	}
	t.Logf("pull request opened -> comment %s; push -> comment edited %s; Ready -> success status %s, other pull request planned again %s (list interval 1s, window 1s)",
		toComment.Round(time.Millisecond), toEdit.Round(time.Millisecond), toSuccess.Round(time.Millisecond), toReplan.Round(time.Millisecond))
	t.Logf("comment after the rollout:\n%s", final.Body)

	// The status branch holds the status commits; main holds only the
	// commits people made.
	waitFor(t, "the status file at the merge, Ready", func() (bool, error) {
		out, err := giteaGit(t, s, repo, "show", "origin/"+statusBranch+":"+report.Path(ns, "edge"))
		return err == nil && strings.Contains(out, "phase: Ready") && strings.Contains(out, merge), err
	})
	authors, err := giteaGit(t, s, repo, "log", "--format=%ae %ce", "origin/main")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(authors, report.DefaultOptions().AuthorEmail) {
		t.Errorf("Capstan committed to main:\n%s", authors)
	}
	tip, _ := giteaGit(t, s, repo, "rev-parse", "origin/main")
	if strings.TrimSpace(tip) != merge {
		t.Errorf("main is at %s, want the merge commit %s", tip, merge)
	}
	history, _ := giteaGit(t, s, repo, "log", "-p", "origin/"+statusBranch)

	// No Secret value anywhere.
	var texts []string
	for _, n := range []int64{pr.Number, bad.Number, five.Number} {
		for _, cm := range ourComments(t, s, repo, n) {
			texts = append(texts, cm.Body)
		}
	}
	for _, st := range []giteaserver.Status{pending, success} {
		texts = append(texts, st.Description)
	}
	texts = append(texts, history, logs.String(), cliOut)
	for _, secret := range []string{plantedFirst, plantedSecond, token, s.Token()} {
		for i, text := range texts {
			if strings.Contains(text, secret) {
				t.Errorf("a Secret value is in text %d (comments, statuses, status branch, logs)", i)
			}
		}
	}
	if !strings.Contains(comment.Body, "data.apiKey: (changed)") {
		t.Errorf("the plan does not say the Secret changes without showing it:\n%s", comment.Body)
	}
}

// giteaGit runs the git CLI on a fresh clone of repo's branches.
func giteaGit(t *testing.T, s *giteaserver.Server, repo giteaserver.Repo, args ...string) (string, error) {
	t.Helper()
	dir := t.TempDir()
	run := func(args ...string) (string, error) {
		cmd := execGit(dir, s, args...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run("init", "--quiet"); err != nil {
		return out, err
	}
	if out, err := run("fetch", "--quiet", s.CloneURL(repo), "+refs/heads/*:refs/remotes/origin/*"); err != nil {
		return out, err
	}
	return run(args...)
}

// execGit is the git CLI in dir, authenticated to s through a header set
// in the environment (never in a URL or an argument).
func execGit(dir string, s *giteaserver.Server, args ...string) *exec.Cmd {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0",
		"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=http.extraHeader", "GIT_CONFIG_VALUE_0=Authorization: "+s.GitAuthHeader())
	return cmd
}
