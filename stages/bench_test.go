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
