package stages_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fluxcd/pkg/ssa"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// benchObjects is how many ConfigMaps one benchmarked stage holds.
const benchObjects = 1000

// benchConcurrency is the executor's default pool, spelled out.
const benchConcurrency = 16

// benchClient is a client of the test control plane without a client-side
// rate limit, as the daemon's: the benchmarks measure what the API server
// allows.
func benchClient(b *testing.B) client.WithWatch {
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = -1, -1
	c, err := client.NewWithWatch(cfg, client.Options{})
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// benchContext bounds a benchmark, which runs its body several times.
func benchContext(b *testing.B) context.Context {
	ctx, cancel := context.WithTimeout(b.Context(), 10*time.Minute)
	b.Cleanup(cancel)
	return ctx
}

func configMapStage(ns string) *stages.Stage {
	objs := make([]*unstructured.Unstructured, benchObjects)
	for i := range objs {
		objs[i] = configMap(ns, fmt.Sprintf("cm-%04d", i), map[string]any{"index": fmt.Sprint(i), "payload": "some configuration"})
	}
	return &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "Config", Action: capstanv1.StageActionApply}, Objects: objs}
}

// BenchmarkApply1000ConfigMaps runs a stage of 1,000 new ConfigMaps into a
// fresh namespace per iteration: the look at the live objects, the
// applies and the readiness check that finds them Current.
func BenchmarkApply1000ConfigMaps(b *testing.B) {
	c := benchClient(b)
	e := stages.NewExecutor(c, stages.WithConcurrency(benchConcurrency))
	ctx := benchContext(b)
	var stage *stages.Stage
	next := func() {
		stage = configMapStage(newNamespace(b))
	}
	next()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res := e.Run(ctx, stage, owner, stages.RunOptions{})
		if res.State != capstanv1.StageReady {
			b.Fatalf("Run = %s: %s", res.State, res.Message)
		}
		if n := len(res.ChangeSet.ToGroupedMap()[ssa.CreatedAction]); n != benchObjects {
			b.Fatalf("created %d objects, want %d", n, benchObjects)
		}
		b.StopTimer()
		next()
		b.StartTimer()
	}
	b.ReportMetric(float64(benchObjects*b.N)/b.Elapsed().Seconds(), "objects/s")
}

// BenchmarkNoopApply1000 runs the same stage again over unchanged objects:
// the cost of a poll that finds nothing to do.
func BenchmarkNoopApply1000(b *testing.B) {
	c := benchClient(b)
	e := stages.NewExecutor(c, stages.WithConcurrency(benchConcurrency))
	ctx := benchContext(b)
	stage := configMapStage(newNamespace(b))
	if res := e.Run(ctx, stage, owner, stages.RunOptions{}); res.State != capstanv1.StageReady {
		b.Fatalf("first Run = %s: %s", res.State, res.Message)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res := e.Run(ctx, stage, owner, stages.RunOptions{})
		if res.State != capstanv1.StageReady {
			b.Fatalf("Run = %s: %s", res.State, res.Message)
		}
		if n := len(res.ChangeSet.ToGroupedMap()[ssa.UnchangedAction]); n != benchObjects {
			b.Fatalf("%d objects unchanged, want %d", n, benchObjects)
		}
	}
	b.ReportMetric(float64(benchObjects*b.N)/b.Elapsed().Seconds(), "objects/s")
}

// BenchmarkApply1000Baseline is the limit the executor is measured
// against: the same 1,000 ConfigMaps server-side applied, unordered, by as
// many parallel workers with the same client, and nothing else (no look at
// the live objects, no dry run, no wait).
func BenchmarkApply1000Baseline(b *testing.B) {
	c := benchClient(b)
	ctx := benchContext(b)
	var stage *stages.Stage
	next := func() { stage = configMapStage(newNamespace(b)) }
	next()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var g errgroup.Group
		g.SetLimit(benchConcurrency)
		for _, obj := range stage.Objects {
			g.Go(func() error {
				return c.Patch(ctx, obj.DeepCopy(), client.Apply, client.ForceOwnership, client.FieldOwner("baseline"))
			})
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		next()
		b.StartTimer()
	}
	b.ReportMetric(float64(benchObjects*b.N)/b.Elapsed().Seconds(), "objects/s")
}

// revisionStage is configMapStage with the objects at changed (indices)
// given the value v: the stage of a new revision over the objects of the
// last one.
func revisionStage(ns string, changed []int, v string) *stages.Stage {
	stage := configMapStage(ns)
	for _, i := range changed {
		stage.Objects[i] = configMap(ns, fmt.Sprintf("cm-%04d", i), map[string]any{"index": fmt.Sprint(i), "payload": v})
	}
	return stage
}

// BenchmarkRevisionApply1000 measures a new revision of a stage of 1,000
// ConfigMaps that exist, ten of them changed (or none): the preflight's
// dry run of every object, then the stage's apply, with the preflight's
// answers handed to the apply (handed) or without (dry-run again); beside
// it the limit, the same 1,000 server-side applied by parallel workers.
func BenchmarkRevisionApply1000(b *testing.B) {
	for _, changed := range []int{10, 0} {
		for _, mode := range []string{"limit", "dry-run-again", "handed"} {
			b.Run(fmt.Sprintf("changed=%d/%s", changed, mode), func(b *testing.B) {
				c := benchClient(b)
				e := stages.NewExecutor(c, stages.WithConcurrency(benchConcurrency))
				ctx := benchContext(b)
				ns := newNamespace(b)
				if mode == "limit" {
					applyAll(ctx, b, c, configMapStage(ns).Objects)
				} else if res := e.Run(ctx, configMapStage(ns), owner, stages.RunOptions{}); res.State != capstanv1.StageReady {
					b.Fatalf("first Run = %s: %s", res.State, res.Message)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					var idx []int
					for j := range changed {
						idx = append(idx, (i*changed+j*97)%benchObjects)
					}
					stage := revisionStage(ns, idx, fmt.Sprintf("revision %d", i))
					b.StartTimer()
					if mode == "limit" {
						applyAll(ctx, b, c, stage.Objects)
						continue
					}
					plan := &stages.Plan{Stages: []stages.Stage{*stage}}
					opts := stages.PreflightOptions{}
					if mode == "handed" {
						plan.DryRuns = &stages.DryRuns{}
						opts.Keep = plan.DryRuns
					}
					report, err := e.Preflight(ctx, plan, owner, opts)
					if err != nil || report.Err() != nil {
						b.Fatalf("Preflight = %v, %v", report.Problems, err)
					}
					res := e.Run(ctx, &plan.Stages[0], owner, stages.RunOptions{DryRuns: plan.DryRuns})
					if res.State != capstanv1.StageReady {
						b.Fatalf("Run = %s: %s", res.State, res.Message)
					}
					// The objects the last iteration changed are restored.
					if n := len(res.ChangeSet.ToGroupedMap()[ssa.ConfiguredAction]); n < len(idx) || n > 2*len(idx) {
						b.Fatalf("configured %d objects, want %d to %d", n, len(idx), 2*len(idx))
					}
				}
				b.ReportMetric(float64(benchObjects*b.N)/b.Elapsed().Seconds(), "objects/s")
			})
		}
	}
}

// applyAll is the limit: objects server-side applied, unordered, by
// benchConcurrency parallel workers, and nothing else.
func applyAll(ctx context.Context, b *testing.B, c client.Client, objects []*unstructured.Unstructured) {
	var g errgroup.Group
	g.SetLimit(benchConcurrency)
	for _, obj := range objects {
		g.Go(func() error {
			return c.Patch(ctx, obj.DeepCopy(), client.Apply, client.ForceOwnership, client.FieldOwner("baseline"))
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
}
