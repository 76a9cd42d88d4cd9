package report

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// Status commits with the root source's credentials go only to
// --status-branch, and only for the deployments the root source serves;
// a deployment with credentials of its own commits where it says.
func TestRootCredentialsCommitOnlyToTheStatusBranch(t *testing.T) {
	const rootURL = "https://git.example/platform.git"
	root := &Root{URL: rootURL, Branch: "main", StatusBranch: "capstan/status", Namespaces: []string{"capstan-system", "team-listed"}}
	noBranch := &Root{URL: rootURL, Branch: "main", Namespaces: []string{"capstan-system"}}
	gitStatus := func(url, branch, secret string) *capstanv1.ReportSpec {
		gs := &capstanv1.GitStatusReport{URL: url, Branch: branch}
		if secret != "" {
			gs.SecretRef = &capstanv1.LocalObjectReference{Name: secret}
		}
		return &capstanv1.ReportSpec{GitStatus: gs}
	}
	tests := []struct {
		name      string
		namespace string
		report    *capstanv1.ReportSpec
		root      *Root
		// reported is whether the status goes anywhere; reject, when set,
		// is a word of the refusal; root whether the root's credentials
		// are used.
		reported bool
		reject   string
		useRoot  bool
	}{
		{"root deployment, no report: the status branch", "capstan-system", nil, root, true, "", true},
		{"root deployment, the status branch named", "capstan-system", gitStatus("", "capstan/status", ""), root, true, "", true},
		{"root deployment, another branch", "capstan-system", gitStatus("", "release", ""), root, true, "--status-branch (capstan/status)", true},
		{"root deployment, the root repository by URL, another branch", "capstan-system", gitStatus("git@git.example:platform.git", "release", ""), root, true, "--status-branch", true},
		{"root deployment, no --status-branch", "capstan-system", gitStatus("", "capstan/status", ""), noBranch, true, "which is not set", true},
		{"root deployment, credentials of its own: any branch", "capstan-system", gitStatus("", "release", "mine"), root, true, "", false},
		{"listed namespace, no report: the status branch", "team-listed", nil, root, true, "", true},
		{"tenant, no report: not reported", "team-a", nil, root, false, "", false},
		{"tenant, the status branch of the root repository", "team-a", gitStatus(rootURL, "capstan/status", ""), root, true, "not team-a", true},
		{"tenant, credentials of its own", "team-a", gitStatus(rootURL, "capstan/status", "mine"), root, true, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: tt.namespace, Name: "cd"}}
			cd.Spec.Report = tt.report
			a, ok := addressOf(cd, tt.root, time.Minute)
			if ok != tt.reported {
				t.Fatalf("reported = %v, want %v", ok, tt.reported)
			}
			if !ok {
				return
			}
			if a.root != tt.useRoot || (a.root && a.secret != (types.NamespacedName{})) {
				t.Errorf("root credentials = %v (secret %s), want %v", a.root, a.secret, tt.useRoot)
			}
			switch {
			case tt.reject == "" && a.reject != "":
				t.Errorf("refused: %s", a.reject)
			case tt.reject != "" && !strings.Contains(a.reject, tt.reject):
				t.Errorf("refusal %q, want it to say %q", a.reject, tt.reject)
			case tt.reject != "" && !strings.Contains(a.reject, "secretRef"):
				t.Errorf("refusal %q does not say how to commit elsewhere (a secretRef of its own)", a.reject)
			}
		})
	}
}

// A deployment refused the root's credentials never shares a batch with
// one that may use them: the refusal stays its own, and the other's
// status is committed.
func TestRootRefusalDoesNotSpreadToItsBatch(t *testing.T) {
	repo := newRepo(t)
	r, rec := startReporter(t, repo, func(o *Options) { o.Settle = time.Second })
	intruder := deployment("intruder", 1)
	intruder.Namespace = "team-a"
	intruder.Spec.Report = &capstanv1.ReportSpec{GitStatus: &capstanv1.GitStatusReport{URL: server.HTTPURL(repo), Branch: "capstan/status"}}
	r.Notify(intruder)
	r.Notify(deployment("alpha", 1))
	waitBranch(t, repo, "status/fleet/alpha.yaml", "currentStage: Stage1")
	if out, err := gitTry(repo, "show", "capstan/status:status/team-a/intruder.yaml"); err == nil {
		t.Errorf("the tenant's status was committed with the root's credentials:\n%s", out)
	}
	select {
	case e := <-rec.Events:
		if !strings.Contains(e, "StatusCommitRejected") || !strings.Contains(e, "team-a") {
			t.Errorf("event %q, want a StatusCommitRejected naming team-a", e)
		}
	case <-time.After(time.Minute):
		t.Fatal("no event for the tenant after a minute")
	}
}
