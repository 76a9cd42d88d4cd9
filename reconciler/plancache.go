package reconciler

import (
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/capstan-dev/capstan/stages"
)

// planCache keeps the plan of each deployment that is walking its stages,
// for the revision and generation it was built from: a stage that waits
// comes back every wait slice, and rendering the same revision again each
// time would cost CPU in proportion to the deployments waiting. A plan is
// dropped when its deployment is Ready (the drift watcher keeps what it
// needs, compactly) or gone.
type planCache struct {
	mu    sync.Mutex
	plans map[types.NamespacedName]cachedPlan
}

type cachedPlan struct {
	revision   string
	generation int64
	objects    []*unstructured.Unstructured
	plan       *stages.Plan
}

func (c *planCache) get(key types.NamespacedName, revision string, generation int64) (cachedPlan, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.plans[key]
	if !ok || p.revision != revision || p.generation != generation {
		return cachedPlan{}, false
	}
	return p, true
}

func (c *planCache) put(key types.NamespacedName, p cachedPlan) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.plans == nil {
		c.plans = map[types.NamespacedName]cachedPlan{}
	}
	c.plans[key] = p
}

func (c *planCache) drop(key types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.plans, key)
}
