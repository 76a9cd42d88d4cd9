package scale

import (
	"context"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// limitWorkers is how many parallel requests the limits send: the
// executor's default pool.
const limitWorkers = 16

// limits are what the API server itself allows for the fleet's objects,
// measured in the same run as the fleet: the plain limit (every object
// applied once by limitWorkers server-side apply workers) and the
// validated limit (every object dry-run, then applied, the same way),
// the honest floor of a reconciler that validates a revision before it
// applies it (issue 29).
type limits struct {
	plain, validated time.Duration
}

// measureLimits applies the fleet's deployments x objects ConfigMaps into
// two fresh namespaces, plainly and validated, and returns how long each
// took. Neither has a client-side rate limit.
func measureLimits(t testing.TB, f fleet) limits {
	t.Helper()
	ctx := context.Background()
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = -1, -1
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var out limits
	for _, validated := range []bool{false, true} {
		ns, err := env.CreateNamespace(ctx, "limit")
		if err != nil {
			t.Fatal(err)
		}
		begin := time.Now()
		passes := []bool{false}
		if validated {
			passes = []bool{true, false}
		}
		for _, dryRun := range passes {
			var g errgroup.Group
			g.SetLimit(limitWorkers)
			for d := range f.deployments {
				for o := range f.objects {
					g.Go(func() error {
						cm := &unstructured.Unstructured{Object: map[string]any{
							"apiVersion": "v1", "kind": "ConfigMap",
							"metadata": map[string]any{"name": fmt.Sprintf("%s-cm-%02d", deploymentName(d), o), "namespace": ns},
							"data":     map[string]any{"deployment": deploymentName(d), "index": fmt.Sprint(o), "setting": fmt.Sprintf("value-%d-%d", d, o)},
						}}
						opts := []client.PatchOption{client.ForceOwnership, client.FieldOwner("limit")}
						if dryRun {
							opts = append(opts, client.DryRunAll)
						}
						return c.Patch(ctx, cm, client.Apply, opts...)
					})
				}
			}
			if err := g.Wait(); err != nil {
				t.Fatal(err)
			}
		}
		if validated {
			out.validated = time.Since(begin)
		} else {
			out.plain = time.Since(begin)
		}
	}
	t.Logf("limits for %d ConfigMaps: plain %.1f s, validated %.1f s", f.deployments*f.objects, out.plain.Seconds(), out.validated.Seconds())
	return out
}
