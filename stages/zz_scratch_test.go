package stages

import (
	"testing"
	"time"

	"github.com/google/cel-go/cel"
)

func TestScratchCost(t *testing.T) {
	env, _ := celEnv()
	for _, e := range []string{
		"lists.range(5000).all(i, lists.range(5000).all(j, i + j >= 0))",
		"lists.range(1000).all(i, i >= 0)",
		"lists.range(100000).all(i, i >= 0)",
		"[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, [1,2,3,4,5,6,7,8,9,10].all(e, [1,2,3,4,5,6,7,8,9,10].all(f, [1,2,3,4,5,6,7,8,9,10].all(g, a+b+c+d+e+f+g > 0)))))))",
	} {
		ast, iss := env.Compile(e)
		if iss.Err() != nil {
			t.Fatal(iss.Err())
		}
		for _, lim := range []uint64{1_000_000, 1 << 62} {
			prg, _ := env.Program(ast, cel.CostLimit(lim), cel.EvalOptions(cel.OptTrackCost))
			start := time.Now()
			_, det, err := prg.Eval(map[string]any{"object": map[string]any{}})
			var cost any
			if det != nil {
				cost = *det.ActualCost()
			}
			t.Logf("%s lim=%d err=%v cost=%v took %s", e[:30], lim, err, cost, time.Since(start))
		}
	}
}
