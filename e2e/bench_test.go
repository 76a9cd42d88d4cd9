package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/reconciler"
)

// chainFiles is an overlay of n stages, each one ConfigMap (ready as soon
// as it exists), so that the time to Ready is the executor's and the
// reconciler's own overhead per stage.
func chainFiles(n int) (map[string]string, []capstanv1.StageSpec) {
	var b strings.Builder
	var specs []capstanv1.StageSpec
	for i := range n {
		name := fmt.Sprintf("S%d", i+1)
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-%d\n  namespace: ${NS}\n  labels: {capstan.dev/stage: %s}\ndata: {i: \"%d\"}\n", i, name, i)
		specs = append(specs, capstanv1.StageSpec{Name: name})
	}
	return map[string]string{
		"chain/kustomization.yaml": "resources: [objects.yaml]\n",
		"chain/objects.yaml":       b.String(),
	}, specs
}

// BenchmarkFiveStageChain measures a git push of a five-stage overlay to
// the deployment being Ready: each stage waits for the previous one, and
// the next stage starts on the watch event, not after a requeue interval.
func BenchmarkFiveStageChain(b *testing.B) {
	c := newClient(b)
	startDaemon(b, nil)
	files, specs := chainFiles(5)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ns := newNamespace(b)
		url, err := gitSrv.CreateRepo(ns)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, "chain"); err != nil {
			b.Fatal(err)
		}
		spec := capstanv1.ClusterDeploymentSpec{
			Source:     &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: url, SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret(b, c, ns)}}},
			Path:       "chain",
			Substitute: map[string]string{"NS": ns},
			Stages:     specs,
		}
		b.StartTimer()
		createDeployment(b, c, ns, "chain", spec)
		waitDeployment(b, c, ns, "chain", "Ready", isReady)
		b.StopTimer()
		deleteDeployment(b, c, ns, "chain")
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N)/5, "ms/stage")
}

// deleteDeployment removes a deployment so that no daemon of a later run
// keeps polling for it.
func deleteDeployment(b *testing.B, c client.Client, ns, name string) {
	cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := c.Delete(context.Background(), cd); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkNoopPoll measures what one poll of an unchanged remote costs a
// Ready deployment: requests to the git server and to the API server.
func BenchmarkNoopPoll(b *testing.B) {
	c := newClient(b)
	ns := newNamespace(b)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		b.Fatal(err)
	}
	files, specs := chainFiles(5)
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, "chain"); err != nil {
		b.Fatal(err)
	}
	_, api := startDaemon(b, nil)
	createDeployment(b, c, ns, "chain", capstanv1.ClusterDeploymentSpec{
		Source:     &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: url, SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret(b, c, ns)}}},
		Path:       "chain",
		Substitute: map[string]string{"NS": ns},
		Stages:     specs,
		Interval:   &metav1.Duration{Duration: 200 * time.Millisecond},
	})
	waitDeployment(b, c, ns, "chain", "Ready", isReady)
	b.Cleanup(func() { deleteDeployment(b, c, ns, "chain") })
	repo := func() int64 {
		return gitSrv.RequestsTo("/"+ns+".git/info/refs") + gitSrv.RequestsTo("/"+ns+".git/git-upload-pack")
	}
	gitBefore, apiBefore := repo(), api.all()
	polls := gitSrv.RequestsTo("/" + ns + ".git/info/refs")
	b.ResetTimer()
	waitFor(b, "polls", func() (bool, error) {
		return gitSrv.RequestsTo("/"+ns+".git/info/refs") >= polls+int64(b.N), nil
	})
	b.StopTimer()
	n := float64(gitSrv.RequestsTo("/"+ns+".git/info/refs") - polls)
	b.ReportMetric(float64(repo()-gitBefore)/n, "git-requests/poll")
	b.ReportMetric(float64(api.all()-apiBefore)/n, "api-requests/poll")
}

// BenchmarkDriftCorrection measures drift on a deployment of 1,000
// ConfigMaps in one stage: what watching them costs per poll of an
// unchanged remote (API requests), and the time from deleting one of them
// to its being applied again.
func BenchmarkDriftCorrection(b *testing.B) {
	c := newClient(b)
	ns := newNamespace(b)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		b.Fatal(err)
	}
	var objects strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&objects, "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-%04d\n  namespace: ${NS}\n  labels: {capstan.dev/stage: Config}\ndata: {i: \"%d\"}\n", i, i)
	}
	files := map[string]string{"drift/kustomization.yaml": "resources: [objects.yaml]\n", "drift/objects.yaml": objects.String()}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, "1,000 ConfigMaps"); err != nil {
		b.Fatal(err)
	}
	_, api := startDaemon(b, nil)
	createDeployment(b, c, ns, "drift", capstanv1.ClusterDeploymentSpec{
		Source:     &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: url, SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret(b, c, ns)}}},
		Path:       "drift",
		Substitute: map[string]string{"NS": ns},
		Stages:     []capstanv1.StageSpec{{Name: "Config"}},
		Interval:   &metav1.Duration{Duration: 200 * time.Millisecond},
	})
	waitDeployment(b, c, ns, "drift", "Ready", isReady)
	b.Cleanup(func() { deleteDeployment(b, c, ns, "drift") })

	// Unchanged: polls cost no API request, the watches included.
	infoRefs := "/" + ns + ".git/info/refs"
	polls, before := gitSrv.RequestsTo(infoRefs), api.all()
	waitFor(b, "ten polls", func() (bool, error) { return gitSrv.RequestsTo(infoRefs) >= polls+10, nil })
	b.ReportMetric(float64(api.all()-before)/float64(gitSrv.RequestsTo(infoRefs)-polls), "api-requests/poll")

	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("cm-%04d", i%1000)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if err := c.Delete(context.Background(), cm); err != nil {
			b.Fatal(err)
		}
		waitFor(b, name+" restored", func() (bool, error) { return object(b, c, configMapGVK, ns, name) != nil, nil })
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/correction")
}

// BenchmarkLookAfterStart measures the look a Capstan takes at a Ready
// deployment it did not walk itself (here: a new daemon after a restart),
// 1,000 ConfigMaps in one stage, unchanged: from the daemon's start until
// its dry run of each has been sent (the render, the look's LIST and
// 1,000 dry runs), and what that costs in requests.
func BenchmarkLookAfterStart(b *testing.B) {
	c := newClient(b)
	ns := newNamespace(b)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		b.Fatal(err)
	}
	files, specs := stagedFiles(1000, 1)
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, "1,000 ConfigMaps"); err != nil {
		b.Fatal(err)
	}
	first, _ := startDaemonWith(b, nil, func(o *reconciler.Options) { o.Config = unlimited(o.Config) })
	createDeployment(b, c, ns, "looked", capstanv1.ClusterDeploymentSpec{
		Source:         &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: url, SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret(b, c, ns)}}},
		Path:           "staged",
		Substitute:     map[string]string{"NS": ns},
		Stages:         specs,
		DeletionPolicy: capstanv1.DeletionPolicyOrphan,
	})
	watchDeployment(b, ns, "looked", isReady)
	b.Cleanup(func() { deleteDeployment(b, c, ns, "looked") })
	stopDaemon(first)

	var took time.Duration
	var requests, dryRuns int
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		d, api := startDaemonWith(b, nil, func(o *reconciler.Options) { o.Config = unlimited(o.Config) })
		waitFor(b, "a dry run of each of the 1,000", func() (bool, error) {
			return api.total("PATCH(dry-run)", "/namespaces/"+ns+"/configmaps/") >= 1000, nil
		})
		took += time.Since(start)
		b.StopTimer()
		if n := api.total("PATCH /", "/namespaces/"+ns+"/configmaps/"); n != 0 {
			b.Fatalf("the look applied %d unchanged ConfigMaps", n)
		}
		requests += api.all()
		dryRuns += api.total("PATCH(dry-run)", "/namespaces/"+ns+"/configmaps/")
		stopDaemon(d)
		b.StartTimer()
	}
	b.ReportMetric(float64(took.Milliseconds())/float64(b.N), "ms/look")
	b.ReportMetric(float64(requests)/float64(b.N), "requests/look")
	b.ReportMetric(float64(dryRuns)/float64(b.N), "dry-runs/look")
}
