package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/ssa"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/reconciler"
)

// limitWorkers is how many parallel server-side apply workers the limit
// uses: the executor's default pool.
const limitWorkers = 16

// unlimited returns cfg without client-side rate limits: the benchmarks
// below measure what the API server allows (its priority and fairness),
// as the daemon does in production.
func unlimited(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = -1, -1
	return cfg
}

// stagedFiles is an overlay of n ConfigMaps spread evenly over stages
// stages, S1..Sstages.
func stagedFiles(n, stages int) (map[string]string, []capstanv1.StageSpec) {
	return stagedFilesWith(n, stages, unchangedPayload)
}

// unchangedPayload is the payload of every ConfigMap of stagedFiles.
func unchangedPayload(int) string { return "some configuration" }

// stagedFilesWith is stagedFiles with the payload of the i-th ConfigMap
// payload(i).
func stagedFilesWith(n, stages int, payload func(int) string) (map[string]string, []capstanv1.StageSpec) {
	var b strings.Builder
	var specs []capstanv1.StageSpec
	for s := range stages {
		specs = append(specs, capstanv1.StageSpec{Name: fmt.Sprintf("S%d", s+1)})
	}
	for i := range n {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-%04d\n  namespace: ${NS}\n  labels: {capstan.dev/stage: S%d}\ndata: {index: \"%d\", payload: %s}\n",
			i, i*stages/n+1, i, payload(i))
	}
	return map[string]string{
		"staged/kustomization.yaml": "resources: [objects.yaml]\n",
		"staged/objects.yaml":       b.String(),
	}, specs
}

// applyUnordered is the limit: the n ConfigMaps of stagedFiles applied into
// ns by limitWorkers parallel server-side apply requests, and nothing else
// (no look, no dry run, no order, no wait, no status).
func applyUnordered(ctx context.Context, c client.Client, ns string, n int) error {
	return applyUnorderedWith(ctx, c, ns, n, unchangedPayload)
}

// applyUnorderedWith is applyUnordered with the payloads of
// stagedFilesWith.
func applyUnorderedWith(ctx context.Context, c client.Client, ns string, n int, payload func(int) string) error {
	var g errgroup.Group
	g.SetLimit(limitWorkers)
	for i := range n {
		g.Go(func() error {
			cm := limitConfigMap(ns, i, payload)
			return c.Patch(ctx, cm, client.Apply, client.ForceOwnership, client.FieldOwner("limit"))
		})
	}
	return g.Wait()
}

// applyValidated is the validated limit: the n ConfigMaps of stagedFiles
// dry-run server-side by limitWorkers parallel workers, every one, and
// then applied the same way. Capstan validates a whole revision before it
// applies any of it (the preflight), so this is its honest floor: the
// plain limit's applies plus a dry run of each object.
func applyValidated(ctx context.Context, c client.Client, ns string, n int, payload func(int) string) error {
	for _, dryRun := range []bool{true, false} {
		var g errgroup.Group
		g.SetLimit(limitWorkers)
		for i := range n {
			g.Go(func() error {
				cm := limitConfigMap(ns, i, payload)
				opts := []client.PatchOption{client.ForceOwnership, client.FieldOwner("validated-limit")}
				if dryRun {
					opts = append(opts, client.DryRunAll)
				}
				return c.Patch(ctx, cm, client.Apply, opts...)
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
	}
	return nil
}

// limitConfigMap is the i-th ConfigMap of stagedFiles in ns, as the limits
// apply it.
func limitConfigMap(ns string, i int, payload func(int) string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": fmt.Sprintf("cm-%04d", i), "namespace": ns},
		"data":     map[string]any{"index": fmt.Sprint(i), "payload": payload(i)},
	}}
}

// applyWithFlux applies the n ConfigMaps of stagedFiles into ns the way
// Flux's kustomize-controller does: fluxcd/pkg/ssa's ApplyAllStaged (a
// GET, a server-side dry run and, when it changes, an apply per object)
// with limitWorkers workers. A reference beside the limit: the engine of
// the reconciler Capstan is measured against, without its fetch, render,
// health checks or status.
func applyWithFlux(ctx context.Context, c client.Client, ns string, n int) error {
	objects := make([]*unstructured.Unstructured, n)
	for i := range n {
		objects[i] = &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": fmt.Sprintf("cm-%04d", i), "namespace": ns},
			"data":     map[string]any{"index": fmt.Sprint(i), "payload": unchangedPayload(i)},
		}}
	}
	m := ssa.NewResourceManager(c, nil, ssa.Owner{Field: "flux-reference", Group: "bench.capstan.dev"})
	m.SetConcurrency(limitWorkers)
	_, err := m.ApplyAllStaged(ctx, objects, ssa.DefaultApplyOptions())
	return err
}

// BenchmarkStagedApplyAgainstLimit measures 1,000 ConfigMaps from a git
// repository to a Ready deployment (fetch, render, the stages in order,
// status), in five stages and in one, each beside the limits measured in
// the same iteration: the same objects applied unordered by parallel
// server-side apply workers (the plain limit), and dry-run then applied so
// (the validated limit, applyValidated). Neither side has a client-side
// rate limit.
func BenchmarkStagedApplyAgainstLimit(b *testing.B) {
	const objects = 1000
	for _, stageCount := range []int{5, 1} {
		b.Run(fmt.Sprintf("stages=%d", stageCount), func(b *testing.B) {
			c, err := client.New(unlimited(env.Config), client.Options{Scheme: reconciler.Scheme()})
			if err != nil {
				b.Fatal(err)
			}
			startDaemonWith(b, nil, func(o *reconciler.Options) { o.Config = unlimited(o.Config) })
			files, specs := stagedFiles(objects, stageCount)
			var staged, limit, validated, flux time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				ns := newNamespace(b)
				url, err := gitSrv.CreateRepo(ns)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, "1,000 ConfigMaps"); err != nil {
					b.Fatal(err)
				}
				spec := capstanv1.ClusterDeploymentSpec{
					Source:     &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: url, SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret(b, c, ns)}}},
					Path:       "staged",
					Substitute: map[string]string{"NS": ns},
					Stages:     specs,
					// Leave the objects when the deployment goes: deleting
					// 1,000 in the background would load the next iteration.
					DeletionPolicy: capstanv1.DeletionPolicyOrphan,
				}
				limitNS, validatedNS, fluxNS := newNamespace(b), newNamespace(b), newNamespace(b)
				b.StartTimer()

				start := time.Now()
				if err := applyUnordered(context.Background(), c, limitNS, objects); err != nil {
					b.Fatal(err)
				}
				limit += time.Since(start)

				start = time.Now()
				if err := applyValidated(context.Background(), c, validatedNS, objects, unchangedPayload); err != nil {
					b.Fatal(err)
				}
				validated += time.Since(start)

				start = time.Now()
				if err := applyWithFlux(context.Background(), c, fluxNS, objects); err != nil {
					b.Fatal(err)
				}
				flux += time.Since(start)

				start = time.Now()
				createDeployment(b, c, ns, "staged", spec)
				watchDeployment(b, ns, "staged", isReady)
				staged += time.Since(start)

				b.StopTimer()
				deleteDeployment(b, c, ns, "staged")
				b.StartTimer()
			}
			b.ReportMetric(float64(staged.Milliseconds())/float64(b.N), "ms/ready")
			b.ReportMetric(float64(limit.Milliseconds())/float64(b.N), "ms/limit")
			b.ReportMetric(float64(staged)/float64(limit), "x-limit")
			b.ReportMetric(float64(validated.Milliseconds())/float64(b.N), "ms/validated-limit")
			b.ReportMetric(float64(staged)/float64(validated), "x-validated")
			b.ReportMetric(float64(flux.Milliseconds())/float64(b.N), "ms/flux-ssa")
			b.ReportMetric(float64(flux)/float64(limit), "flux-x-limit")
		})
	}
}

// BenchmarkRevisionAgainstLimit measures a new commit that changes 10 of
// the 1,000 ConfigMaps of a Ready deployment in 5 stages, from the commit
// to Ready at it (the poll that finds it, fetch, render, preflight, the
// stages, status), beside the limits measured in the same iteration: the
// 1,000 applied again, unordered, by parallel server-side apply workers,
// and the same dry-run first (applyValidated).
func BenchmarkRevisionAgainstLimit(b *testing.B) {
	const objects, changed = 1000, 10
	c, err := client.New(unlimited(env.Config), client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	startDaemonWith(b, nil, func(o *reconciler.Options) { o.Config = unlimited(o.Config) })
	ns, limitNS, validatedNS := newNamespace(b), newNamespace(b), newNamespace(b)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		b.Fatal(err)
	}
	files, specs := stagedFiles(objects, 5)
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, "1,000 ConfigMaps"); err != nil {
		b.Fatal(err)
	}
	createDeployment(b, c, ns, "staged", capstanv1.ClusterDeploymentSpec{
		Source:         &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: url, SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret(b, c, ns)}}},
		Path:           "staged",
		Substitute:     map[string]string{"NS": ns},
		Stages:         specs,
		Interval:       &metav1.Duration{Duration: 200 * time.Millisecond},
		DeletionPolicy: capstanv1.DeletionPolicyOrphan,
	})
	waitDeployment(b, c, ns, "staged", "Ready", isReady)
	b.Cleanup(func() { deleteDeployment(b, c, ns, "staged") })
	if err := applyUnordered(context.Background(), c, limitNS, objects); err != nil {
		b.Fatal(err)
	}
	if err := applyValidated(context.Background(), c, validatedNS, objects, unchangedPayload); err != nil {
		b.Fatal(err)
	}
	var staged, limit, validated time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		payload := func(j int) string {
			if j%(objects/changed) == i%(objects/changed) {
				return fmt.Sprintf("revision %d", i)
			}
			return unchangedPayload(j)
		}
		files, _ := stagedFilesWith(objects, 5, payload)
		b.StartTimer()

		start := time.Now()
		if err := applyUnorderedWith(context.Background(), c, limitNS, objects, payload); err != nil {
			b.Fatal(err)
		}
		limit += time.Since(start)

		start = time.Now()
		if err := applyValidated(context.Background(), c, validatedNS, objects, payload); err != nil {
			b.Fatal(err)
		}
		validated += time.Since(start)

		start = time.Now()
		sha, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, fmt.Sprintf("revision %d", i))
		if err != nil {
			b.Fatal(err)
		}
		watchDeployment(b, ns, "staged", func(cd *capstanv1.ClusterDeployment) bool {
			return isReady(cd) && strings.HasSuffix(cd.Status.Revision, sha)
		})
		staged += time.Since(start)
	}
	b.ReportMetric(float64(staged.Milliseconds())/float64(b.N), "ms/ready")
	b.ReportMetric(float64(limit.Milliseconds())/float64(b.N), "ms/limit")
	b.ReportMetric(float64(staged)/float64(limit), "x-limit")
	b.ReportMetric(float64(validated.Milliseconds())/float64(b.N), "ms/validated-limit")
	b.ReportMetric(float64(staged)/float64(validated), "x-validated")
}

// watchDeployment waits until the deployment's status satisfies cond, on
// a watch: the benchmarks time the moment the status is written, and
// polling (waitDeployment) would both add half a poll period and load the
// API server with GETs of a status that lists 1,000 objects.
func watchDeployment(b *testing.B, ns, name string, cond func(*capstanv1.ClusterDeployment) bool) {
	b.Helper()
	c, err := client.NewWithWatch(unlimited(env.Config), client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	list := &capstanv1.ClusterDeploymentList{}
	w, err := c.Watch(ctx, list, client.InNamespace(ns), client.MatchingFields{"metadata.name": name})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	last := "no event"
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				b.Fatalf("watch of ClusterDeployment %s/%s ended; last status: %s", ns, name, last)
			}
			cd, isCD := ev.Object.(*capstanv1.ClusterDeployment)
			if !isCD {
				continue
			}
			if cond(cd) {
				return
			}
			last = describe(cd)
		case <-ctx.Done():
			b.Fatalf("timed out after %s waiting for ClusterDeployment %s/%s; last status: %s", waitTimeout, ns, name, last)
		}
	}
}
