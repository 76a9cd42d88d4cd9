package stages

import (
	"sync"
	"time"
)

// namespaceMemoTTL is how long a namespace the preflight found is taken to
// exist without asking again.
const namespaceMemoTTL = 30 * time.Second

// namespaceMemo remembers which namespaces of the cluster Capstan runs in
// the preflight found, for namespaceMemoTTL: a fleet of deployments in one
// namespace asked for it once per deployment and revision. Only "it
// exists" is remembered, whoever asked: a namespace deleted since fails
// the dry runs of its objects instead (an error, never a pass), and a
// ServiceAccount that may not read namespaces is taken to see them exist
// anyway (plancheck), so nothing is learnt from the memo that the
// deployment's own identity would not learn. Other clusters are not
// remembered: the executors On makes ask each time.
type namespaceMemo struct {
	mu sync.Mutex
	at map[string]time.Time // namespace: when it was last found
}

// home reports whether e acts on the cluster Capstan runs in: its own
// identity there is the home cluster's client (As keeps it; On replaces
// it).
func (m *namespaceMemo) home(e *Executor) bool {
	return m != nil && e.own != nil && e.own == e.home
}

// found reports whether ns was found within the TTL.
func (m *namespaceMemo) found(e *Executor, ns string, now time.Time) bool {
	if !m.home(e) {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	at, ok := m.at[ns]
	return ok && now.Sub(at) < namespaceMemoTTL
}

// saw records that ns exists, found at now.
func (m *namespaceMemo) saw(e *Executor, ns string, now time.Time) {
	if !m.home(e) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.at == nil {
		m.at = map[string]time.Time{}
	}
	for k, at := range m.at {
		if now.Sub(at) >= namespaceMemoTTL {
			delete(m.at, k)
		}
	}
	m.at[ns] = now
}
