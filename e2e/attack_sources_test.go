package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/trickle"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/reconciler/report"
	"github.com/capstan-dev/capstan/sources/git"
)

// The attacks of issue 26 on the root source, status commits with the
// root credentials, and sources that answer slowly (docs/root-source.md,
// docs/deadlines.md).

// tenantOfRoot is a ClusterDeployment a tenant creates without a source:
// it names a path of the platform's repository, hoping to read it.
func tenantOfRoot(ns string) capstanv1.ClusterDeploymentSpec {
	return capstanv1.ClusterDeploymentSpec{
		Path:       "clusters/alpha/overlay",
		Substitute: map[string]string{"NS": ns},
		Interval:   &metav1.Duration{Duration: 500 * time.Millisecond},
	}
}

// A tenant in a namespace the root source does not serve creates a
// deployment without spec.source: it must not read the platform's
// repository (its paths, its substitutions). It stalls naming the rule;
// nothing is fetched, rendered or applied for it. A namespace that
// `capstan run --root-source-namespaces` lists is served.
func TestAttackTenantWithoutSourceReadsRoot(t *testing.T) {
	c := newClient(t)
	home, tenant, listed := newNamespace(t), newNamespace(t), newNamespace(t)
	url, err := gitSrv.CreateRepo(home)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(home, gitserver.DefaultBranch, rootCluster("alpha", home), "add alpha"); err != nil {
		t.Fatal(err)
	}
	d, _ := startDaemonWith(t, &reconciler.RootOptions{
		URL: url, Branch: "main", Path: "clusters", Namespace: home, Interval: 500 * time.Millisecond,
		Auth:       git.Auth{Username: "capstan", Password: "s3cret-token"},
		Namespaces: []string{listed},
	}, nil)
	waitDeployment(t, c, home, "alpha", "Ready", isReady)
	before := d.Reconciler().Stats()

	createDeployment(t, c, tenant, "steal", tenantOfRoot(tenant))
	cd := waitDeployment(t, c, tenant, "steal", "Stalled naming the root source rule", func(cd *capstanv1.ClusterDeployment) bool {
		s := condition(cd, capstanv1.ConditionStalled)
		return s != nil && s.Status == metav1.ConditionTrue
	})
	msg := condition(cd, capstanv1.ConditionStalled).Message
	for _, want := range []string{tenant, "--root-source-namespaces", "spec.source"} {
		if !strings.Contains(msg, want) {
			t.Errorf("Stalled message %q does not name %q", msg, want)
		}
	}
	if cm := object(t, c, configMapGVK, tenant, "alpha-settings"); cm != nil {
		t.Errorf("the tenant applied the platform's overlay: ConfigMap %s/alpha-settings exists", tenant)
	}
	if after := d.Reconciler().Stats(); after.Renders != before.Renders || after.Fetches != before.Fetches {
		t.Errorf("the root artifact was read for the tenant: renders %d -> %d, fetches %d -> %d",
			before.Renders, after.Renders, before.Fetches, after.Fetches)
	}
	if cd.Status.Revision != "" {
		t.Errorf("the tenant's status records a root revision: %s", cd.Status.Revision)
	}

	createDeployment(t, c, listed, "served", tenantOfRoot(listed))
	waitDeployment(t, c, listed, "served", "Ready", isReady)
	if object(t, c, configMapGVK, listed, "alpha-settings") == nil {
		t.Errorf("the listed namespace's deployment is Ready but its ConfigMap is missing")
	}
}

// Status commits with the root source's credentials go only to
// --status-branch. A root deployment that asks for another branch
// (spec.report.gitStatus without a secretRef of its own) is refused
// with an event and nothing is pushed there; a tenant without a source
// gets no status commit with the root credentials at all; the
// configured status branch still works.
func TestAttackStatusBranchWithRootCredentials(t *testing.T) {
	c := newClient(t)
	home, tenant := newNamespace(t), newNamespace(t)
	url, err := gitSrv.CreateRepo(home)
	if err != nil {
		t.Fatal(err)
	}
	files := rootCluster("alpha", home)
	for k, v := range rootCluster("beta", home) {
		files[k] = v
	}
	files["clusters/beta/clusterdeployment.yaml"] += "  report: {gitStatus: {branch: release}}\n"
	if _, err := gitSrv.Commit(home, gitserver.DefaultBranch, files, "alpha reports by default, beta to release"); err != nil {
		t.Fatal(err)
	}
	startDaemonWith(t, &reconciler.RootOptions{
		URL: url, Branch: "main", Path: "clusters", Namespace: home, Interval: 500 * time.Millisecond,
		Auth: git.Auth{Username: "capstan", Password: "s3cret-token"},
	}, func(o *reconciler.Options) {
		o.Report = reconciler.ReportOptions{StatusBranch: statusBranch, Interval: time.Second}
	})
	spec := tenantOfRoot(tenant)
	spec.Report = &capstanv1.ReportSpec{GitStatus: &capstanv1.GitStatusReport{URL: url, Branch: statusBranch}}
	createDeployment(t, c, tenant, "intruder", spec)

	waitDeployment(t, c, home, "alpha", "Ready", isReady)
	waitDeployment(t, c, home, "beta", "Ready", isReady)
	waitStatusFile(t, gitSrv, home, home, "alpha", "Ready on the configured status branch", func(f *report.File) bool { return f.Phase == report.PhaseReady })
	// Whatever its fate (it stalls: TestAttackTenantWithoutSourceReadsRoot),
	// the tenant's status is written, and handed to the reporter.
	waitDeployment(t, c, tenant, "intruder", "a status", func(cd *capstanv1.ClusterDeployment) bool {
		return condition(cd, capstanv1.ConditionReady) != nil
	})
	// A new commit makes alpha report again: once its file shows that
	// revision, the reporter has had a window after beta's and the
	// tenant's statuses were queued, and would have pushed them.
	next, err := gitSrv.Commit(home, gitserver.DefaultBranch, map[string]string{"README": "a new revision\n"}, "touch")
	if err != nil {
		t.Fatal(err)
	}
	waitStatusFile(t, gitSrv, home, home, "alpha", "Ready at the new revision", func(f *report.File) bool {
		return f.Phase == report.PhaseReady && f.Revision == "main@sha1:"+next
	})
	if out, ok := repoGit(gitSrv, home, "log", "--format=%h %an: %s", "refs/heads/release"); ok {
		t.Errorf("status commits were pushed to branch release with the root credentials:\n%s", out)
	}
	if f, raw := statusFile(t, gitSrv, home, tenant, "intruder"); f != nil {
		t.Errorf("the tenant's status was committed with the root credentials:\n%s", raw)
	}
	waitFor(t, "a StatusCommitRejected event on beta naming --status-branch", func() (bool, error) {
		msg := eventMessages(t, c, home, "beta", "StatusCommitRejected")
		return strings.Contains(msg, "--status-branch") && strings.Contains(msg, "release"), fmt.Errorf("events: %q", msg)
	})
	waitFor(t, "a StatusCommitRejected event on the tenant's deployment", func() (bool, error) {
		msg := eventMessages(t, c, tenant, "intruder", "StatusCommitRejected")
		return strings.Contains(msg, tenant) && strings.Contains(msg, "secretRef"), fmt.Errorf("events: %q", msg)
	})
}

// Four deployments whose sources answer one byte per second do not keep
// a fifth, on a healthy source, from reaching Ready within its interval,
// with as many reconcile workers as slow sources; each of the four fails
// with a reason that names its source and spec.timeout.
func TestAttackSlowLorisSources(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	const slowTimeout = 30 * time.Second
	const healthyInterval = 20 * time.Second
	slow := trickle.Start(gitSrv.URL(), trickle.Options{Interval: time.Second})
	t.Cleanup(slow.Close)
	secret := gitSecret(t, c, ns)
	startDaemonWith(t, nil, func(o *reconciler.Options) { o.Workers = 4 })

	for i := range 4 {
		repo := fmt.Sprintf("%s-slow-%d", ns, i)
		if _, err := gitSrv.CreateRepo(repo); err != nil {
			t.Fatal(err)
		}
		if _, err := gitSrv.Commit(repo, gitserver.DefaultBranch, twoStageFiles("1"), "slow"); err != nil {
			t.Fatal(err)
		}
		spec := twoStageSpec(slow.URL+"/"+repo+".git", ns, secret)
		spec.Timeout = &metav1.Duration{Duration: slowTimeout}
		spec.Interval = &metav1.Duration{Duration: time.Minute}
		createDeployment(t, c, ns, fmt.Sprintf("slow-%d", i), spec)
	}
	waitFor(t, "four requests held by the slow server", func() (bool, error) {
		n := slow.InFlight()
		return n >= 4, fmt.Errorf("%d requests under way", n)
	})

	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, map[string]string{
		"fast/kustomization.yaml": "resources: [cm.yaml]\n",
		"fast/cm.yaml":            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: fast, namespace: '${NS}'}\ndata: {k: v}\n",
	}, "healthy"); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	createDeployment(t, c, ns, "healthy", capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
			URL: url, Ref: capstanv1.GitRef{Branch: "main"}, SecretRef: &capstanv1.LocalObjectReference{Name: secret},
		}},
		Path: "fast", Substitute: map[string]string{"NS": ns},
		Interval: &metav1.Duration{Duration: healthyInterval},
	})
	// One interval, and a little for a loaded machine; still well short
	// of the slow sources' spec.timeout, which must not be what frees a
	// worker for it.
	deadline := created.Add(healthyInterval + 5*time.Second)
	for !isReady(getDeployment(t, c, ns, "healthy")) {
		if time.Now().After(deadline) {
			t.Fatalf("the healthy deployment is not Ready within one interval (%s) while four sources trickle: %s",
				healthyInterval, describe(getDeployment(t, c, ns, "healthy")))
		}
		time.Sleep(100 * time.Millisecond)
	}

	for i := range 4 {
		name := fmt.Sprintf("slow-%d", i)
		want := slow.URL + "/" + fmt.Sprintf("%s-slow-%d", ns, i) + ".git"
		waitDeployment(t, c, ns, name, "failed on spec.timeout, naming its source", func(cd *capstanv1.ClusterDeployment) bool {
			s := condition(cd, capstanv1.ConditionSourceReady)
			return s != nil && s.Status == metav1.ConditionFalse && s.Reason == "SourceTimeout" &&
				strings.Contains(s.Message, want) && strings.Contains(s.Message, "did not finish within 30s (spec.timeout)")
		})
	}
}
