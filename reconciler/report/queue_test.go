package report

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

var t0 = time.Date(2025, 5, 1, 10, 0, 0, 0, time.UTC)

func status(name, msg string) (*capstanv1.ClusterDeployment, string) {
	cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}}
	cd.Status.CurrentStage = msg
	return cd, name + "/" + msg
}

func addr(repo string) address {
	return address{url: "https://git.example/" + repo, branch: "capstan/status", interval: 30 * time.Second}
}

// taken names the deployments and statuses of batches.
func taken(bs []batch) []string {
	var out []string
	for _, b := range bs {
		for _, it := range b.items {
			out = append(out, it.hash)
		}
	}
	return out
}

// commitAll finishes every item of bs as committed at now.
func commitAll(q *queue, bs []batch, now time.Time) {
	for _, b := range bs {
		for _, it := range b.items {
			q.finish(it, outcomeCommitted, now, now)
		}
		q.release(b.address)
	}
}

// A burst of transitions of one deployment gives one commit per window:
// the first after the settle delay, the next a window after it, holding
// the last status of the burst.
func TestQueueCoalescesABurst(t *testing.T) {
	q := newQueue(time.Second, time.Second, time.Minute)
	commits := 0
	var last []string
	var lastCommit time.Time
	// 100 transitions, one every 200ms, over 20s; the worker looks every 100ms.
	for ms := 0; ms <= 25_000; ms += 100 {
		now := t0.Add(time.Duration(ms) * time.Millisecond)
		if ms%200 == 0 && ms < 20_000 {
			cd, h := status("a", fmt.Sprintf("transition %d", ms/200))
			q.mark(cd, h, addr("infra"), now)
		}
		if bs := q.take(now); len(bs) > 0 {
			if !lastCommit.IsZero() && now.Sub(lastCommit) < 30*time.Second {
				t.Fatalf("commit at %s, %s after the last: inside the window", now.Sub(t0), now.Sub(lastCommit))
			}
			commits++
			last, lastCommit = taken(bs), now
			commitAll(q, bs, now)
		}
	}
	// The window ends at 31s: the last status is committed then.
	for ms := 25_000; ms <= 40_000; ms += 100 {
		now := t0.Add(time.Duration(ms) * time.Millisecond)
		if bs := q.take(now); len(bs) > 0 {
			commits++
			last = taken(bs)
			commitAll(q, bs, now)
		}
	}
	if commits != 2 {
		t.Errorf("100 transitions in 20s made %d commits with a 30s window, want 2", commits)
	}
	if want := "a/transition 99"; len(last) != 1 || last[0] != want {
		t.Errorf("last commit holds %v, want %s", last, want)
	}
	if _, waiting := q.next(); waiting {
		t.Error("something still waits after the last status was committed")
	}
}

func TestQueue(t *testing.T) {
	type step struct {
		at     time.Duration // since t0
		mark   string        // "deployment/status" to mark, in repo infra unless prefixed "other:"
		take   []string      // expected taken hashes at this time ("" means check nothing)
		finish outcome       // how what was taken ends
		check  bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "the first change waits the settle delay, not the window",
			steps: []step{
				{at: 0, mark: "a/1"},
				{at: 500 * time.Millisecond, check: true},
				{at: time.Second, check: true, take: []string{"a/1"}},
			},
		},
		{
			name: "deployments of one repository share a commit; another repository commits apart",
			steps: []step{
				{at: 0, mark: "a/1"},
				{at: 200 * time.Millisecond, mark: "b/1"},
				{at: 300 * time.Millisecond, mark: "other:c/1"},
				{at: time.Second, check: true, take: []string{"a/1", "b/1"}},
				{at: 1300 * time.Millisecond, check: true, take: []string{"c/1"}},
			},
		},
		{
			name: "a deployment inside its window does not join a commit of its repository",
			steps: []step{
				{at: 0, mark: "a/1"},
				{at: time.Second, check: true, take: []string{"a/1"}},
				{at: 2 * time.Second, mark: "a/2"},
				{at: 3 * time.Second, mark: "b/1"},
				{at: 4 * time.Second, check: true, take: []string{"b/1"}},
				{at: 31 * time.Second, check: true, take: []string{"a/2"}},
			},
		},
		{
			name: "a status that went back to what the branch holds is not committed",
			steps: []step{
				{at: 0, mark: "a/1"},
				{at: time.Second, check: true, take: []string{"a/1"}},
				{at: 2 * time.Second, mark: "a/1"},
				{at: 40 * time.Second, check: true},
			},
		},
		{
			name: "a failed commit is retried after a backoff, with the latest status",
			steps: []step{
				{at: 0, mark: "a/1"},
				{at: time.Second, check: true, take: []string{"a/1"}, finish: outcomeFailed},
				{at: 1500 * time.Millisecond, mark: "a/2"},
				{at: 1900 * time.Millisecond, check: true},
				{at: 2 * time.Second, check: true, take: []string{"a/2"}, finish: outcomeFailed},
				{at: 3900 * time.Millisecond, check: true},
				{at: 4 * time.Second, check: true, take: []string{"a/2"}},
			},
		},
		{
			name: "a status that arrives during the push stays pending",
			steps: []step{
				{at: 0, mark: "a/1"},
				{at: time.Second, check: true, take: []string{"a/1"}, finish: -1}, // not finished yet
				{at: 1100 * time.Millisecond, mark: "a/2"},
				{at: 1200 * time.Millisecond, check: true},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := newQueue(time.Second, time.Second, time.Minute)
			for _, s := range tt.steps {
				now := t0.Add(s.at)
				if s.mark != "" {
					repo, m := "infra", s.mark
					if len(m) > 6 && m[:6] == "other:" {
						repo, m = "other", m[6:]
					}
					name, msg := m[:1], m[2:]
					cd, h := status(name, msg)
					q.mark(cd, h, addr(repo), now)
				}
				if !s.check {
					continue
				}
				bs := q.take(now)
				got := taken(bs)
				if fmt.Sprint(got) != fmt.Sprint(s.take) {
					t.Fatalf("at %s took %v, want %v", s.at, got, s.take)
				}
				if s.finish < 0 {
					continue
				}
				for _, b := range bs {
					for _, it := range b.items {
						q.finish(it, s.finish, now, now)
					}
					q.release(b.address)
				}
			}
		})
	}
}
