package stages

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	lcmv1 "github.com/capstan-dev/capstan/api/lcm/v1alpha1"
	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// release returns the StateItems of one release for a machine type.
func release(t lcmv1.MachineType, version string) []lcmv1.StateItem {
	return []lcmv1.StateItem{
		{Name: "download", Phase: lcmv1.StatePhasePrepare, Runner: "downloader", Version: version},
		{Name: "join-" + string(t), Phase: lcmv1.StatePhaseDeploy, Runner: "ansible", Version: version},
		{Name: "managers", Phase: lcmv1.StatePhaseReconfigure, Runner: "ansible", Version: version},
	}
}

func prepareOf(items []lcmv1.StateItem) []lcmv1.StateItem {
	return slices.DeleteFunc(slices.Clone(items), func(i lcmv1.StateItem) bool { return i.Phase != lcmv1.StatePhasePrepare })
}

func lcmCluster(version string) *lcmv1.LCMCluster {
	return &lcmv1.LCMCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "east", Namespace: "ns", Generation: 1},
		Spec: lcmv1.LCMClusterSpec{Release: "r-" + version, MachineTypes: lcmv1.MachineTypes{
			Manager: release(lcmv1.MachineTypeManager, version),
			Worker:  release(lcmv1.MachineTypeWorker, version),
		}},
	}
}

// machineIn builds a machine of the cluster; its state is set by the
// helpers below, as the agent would leave it.
func machineIn(name string, t lcmv1.MachineType) *rolloutMachine {
	return &rolloutMachine{LCMMachine: &lcmv1.LCMMachine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Generation: 1},
		Spec:       lcmv1.LCMMachineSpec{Type: t, ClusterName: "east"},
		Status:     lcmv1.LCMMachineStatus{ObservedGeneration: 1, State: lcmv1.MachineStatePending, Hostname: name},
	}, NodeFound: true}
}

func (m *rolloutMachine) unreported() *rolloutMachine {
	m.Status = lcmv1.LCMMachineStatus{}
	m.NodeFound = false
	return m
}

// given sets the machine's spec items, as the rollout does.
func (m *rolloutMachine) given(items []lcmv1.StateItem) *rolloutMachine {
	if !sameItems(m.Spec.StateItems, items) {
		m.Spec.StateItems = slices.Clone(items)
		m.Generation++
	}
	return m
}

// finished plays the agent that ran every item of the spec.
func (m *rolloutMachine) finished() *rolloutMachine {
	m.Status.ObservedGeneration = m.Generation
	m.Status.StateItemResults = nil
	hasDeploy := false
	for _, item := range m.Spec.StateItems {
		m.Status.StateItemResults = append(m.Status.StateItemResults, lcmv1.StateItemResult{
			Name: item.Name, Phase: item.Phase, Version: item.Version, State: lcmv1.StateItemSucceeded, Attempts: 1,
		})
		hasDeploy = hasDeploy || item.Phase == lcmv1.StatePhaseDeploy
	}
	m.Status.State = lcmv1.MachineStatePending
	if hasDeploy {
		m.Status.State = lcmv1.MachineStateReady
	}
	return m
}

// working plays the agent that started the first unfinished item.
func (m *rolloutMachine) working(state lcmv1.MachineState) *rolloutMachine {
	m.Status.ObservedGeneration = m.Generation
	m.Status.State = state
	if pending := m.LCMMachine.PendingItems(); len(pending) > 0 {
		item := pending[0]
		m.Status.StateItemResults = slices.DeleteFunc(m.Status.StateItemResults, func(r lcmv1.StateItemResult) bool { return r.Name == item.Name })
		m.Status.StateItemResults = append(m.Status.StateItemResults, lcmv1.StateItemResult{
			Name: item.Name, Phase: item.Phase, Version: item.Version, State: lcmv1.StateItemRunning, Attempts: 1,
		})
	}
	return m
}

func (m *rolloutMachine) failing() *rolloutMachine {
	last := &m.Status.StateItemResults[len(m.Status.StateItemResults)-1]
	last.State, last.ExitCode, last.Message = lcmv1.StateItemFailed, ptr.To[int32](2), "no space left on device"
	return m
}

func (m *rolloutMachine) cordoned() *rolloutMachine {
	m.DrainMark = drainMarkCordoned
	return m
}

func (m *rolloutMachine) noNode() *rolloutMachine {
	m.NodeFound = false
	return m
}

// fleet builds n machines of a type, named type-000 on, each passed to
// shape (nil: fresh and reported).
func fleet(t lcmv1.MachineType, n int, shape func(i int, m *rolloutMachine)) []*rolloutMachine {
	out := make([]*rolloutMachine, n)
	for i := range n {
		out[i] = machineIn(fmt.Sprintf("%s-%03d", t, i), t)
		if shape != nil {
			shape(i, out[i])
		}
	}
	return out
}

func clusterOf(c *lcmv1.LCMCluster, groups ...[]*rolloutMachine) rolloutCluster {
	rc := rolloutCluster{Namespace: "ns", Name: "east", Cluster: c}
	for _, g := range groups {
		for _, m := range g {
			rc.Machines = append(rc.Machines, *m)
		}
	}
	slices.SortFunc(rc.Machines, func(a, b rolloutMachine) int { return strings.Compare(a.Name, b.Name) })
	return rc
}

var (
	v1, v2         = lcmCluster("1"), lcmCluster("2")
	managerV1      = release(lcmv1.MachineTypeManager, "1")
	workerV1       = release(lcmv1.MachineTypeWorker, "1")
	workerV2       = release(lcmv1.MachineTypeWorker, "2")
	prepareV1      = prepareOf(workerV1)
	prepareAll     = rolloutSettings{phase: lcmv1.StatePhasePrepare, batch: 50}
	deployAll      = rolloutSettings{phase: lcmv1.StatePhaseDeploy, batch: 50}
	deployManagers = rolloutSettings{machineType: lcmv1.MachineTypeManager, phase: lcmv1.StatePhaseDeploy, batch: 50}
	deployWorkers  = rolloutSettings{machineType: lcmv1.MachineTypeWorker, phase: lcmv1.StatePhaseDeploy, batch: 50}
	firstWorker    = rolloutSettings{machineType: lcmv1.MachineTypeWorker, phase: lcmv1.StatePhaseDeploy, batch: 50, limit: 1}
)

// newPrepareAndReconfigure is release 1 with new prepare and reconfigure
// items and the same deploy items.
var newPrepareAndReconfigure = func() *lcmv1.LCMCluster {
	c := lcmCluster("1")
	c.Spec.MachineTypes.Worker[0].Version = "2"
	c.Spec.MachineTypes.Worker[2].Version = "2"
	return c
}()

func prepared(_ int, m *rolloutMachine) {
	m.given(prepareOf(desiredItems(v1, m.Spec.Type))).finished()
}

func readyAtV1(_ int, m *rolloutMachine) {
	m.given(desiredItems(v1, m.Spec.Type)).finished()
}

// handedOut lists a step's hand-outs as "name" or "name(drain)".
func handedOut(step rolloutStep) []string {
	var out []string
	for _, h := range step.HandOuts {
		s := h.Machine.Name
		if h.Drain {
			s += "(drain)"
		}
		out = append(out, s)
	}
	return out
}

func names(machines []rolloutMachine) []string {
	var out []string
	for _, m := range machines {
		out = append(out, m.Name)
	}
	return out
}

func TestRolloutPlan(t *testing.T) {
	cases := []struct {
		name     string
		cluster  rolloutCluster
		settings rolloutSettings
		// hand lists the machines handed items, "(drain)" when drained first.
		hand    []string
		release []string
		done    bool
		// waiting holds a piece of the first message, when set.
		waiting string
	}{
		{
			name: "prepare goes to every reported machine at once, whatever its type",
			cluster: clusterOf(v1, fleet(lcmv1.MachineTypeManager, 2, nil), fleet(lcmv1.MachineTypeWorker, 3, nil),
				[]*rolloutMachine{machineIn("worker-late", lcmv1.MachineTypeWorker).unreported()}),
			settings: prepareAll,
			hand:     []string{"manager-000", "manager-001", "worker-000", "worker-001", "worker-002"},
			waiting:  "1 not reported by their agent yet (worker-late)",
		},
		{
			name:     "prepare is done once every machine ran its prepare items",
			cluster:  clusterOf(v1, fleet(lcmv1.MachineTypeManager, 2, prepared), fleet(lcmv1.MachineTypeWorker, 3, prepared)),
			settings: prepareAll,
			done:     true,
		},
		{
			name:     "prepare waits for a machine still preparing and names a failing item first",
			cluster:  clusterOf(v1, []*rolloutMachine{machineIn("worker-000", lcmv1.MachineTypeWorker).given(prepareV1).working(lcmv1.MachineStatePrepare).failing()}),
			settings: prepareAll,
			waiting:  "worker-000 Prepare (download 1 Failed, attempt 1, exit code 2: no space left on device)",
		},
		{
			name:     "the first manager goes alone",
			cluster:  clusterOf(v1, fleet(lcmv1.MachineTypeManager, 3, prepared)),
			settings: deployManagers,
			hand:     []string{"manager-000"},
			waiting:  "0/3 managers Ready, one at a time",
		},
		{
			name: "no manager starts while one is at work",
			cluster: clusterOf(v1, fleet(lcmv1.MachineTypeManager, 3, func(i int, m *rolloutMachine) {
				prepared(i, m)
				if i == 0 {
					m.given(managerV1).working(lcmv1.MachineStateDeploy)
				}
			})),
			settings: deployManagers,
			waiting:  "manager-000 Deploy (join-manager 1 Running, attempt 1)",
		},
		{
			name: "the next manager follows once the one before is Ready",
			cluster: clusterOf(v1, fleet(lcmv1.MachineTypeManager, 3, func(i int, m *rolloutMachine) {
				prepared(i, m)
				if i == 0 {
					readyAtV1(i, m)
				}
			})),
			settings: deployManagers,
			hand:     []string{"manager-001"},
		},
		{
			name: "a manager still upgrading to an older release keeps the slot and gets the newest items",
			cluster: clusterOf(v2, fleet(lcmv1.MachineTypeManager, 3, func(i int, m *rolloutMachine) {
				readyAtV1(i, m)
				if i == 2 {
					m.given(release(lcmv1.MachineTypeManager, "1.5")).working(lcmv1.MachineStateUpgrade)
				}
			})),
			settings: deployManagers,
			hand:     []string{"manager-002"},
		},
		{
			name:     "a stage over every type keeps the workers waiting for the managers",
			cluster:  clusterOf(v1, fleet(lcmv1.MachineTypeManager, 2, prepared), fleet(lcmv1.MachineTypeWorker, 4, prepared)),
			settings: deployAll,
			hand:     []string{"manager-000"},
			waiting:  "4 workers wait for the managers",
		},
		{
			name:     "workers start in a window of the batch size",
			cluster:  clusterOf(v1, fleet(lcmv1.MachineTypeWorker, 7, prepared)),
			settings: rolloutSettings{machineType: lcmv1.MachineTypeWorker, phase: lcmv1.StatePhaseDeploy, batch: 3},
			hand:     []string{"worker-000", "worker-001", "worker-002"},
			waiting:  "0/7 workers Ready, 3 at work (at most 3 at once), 4 waiting for a slot",
		},
		{
			name: "workers at work, whoever started them, hold their slots",
			cluster: clusterOf(v1, fleet(lcmv1.MachineTypeWorker, 8, func(i int, m *rolloutMachine) {
				prepared(i, m)
				switch i {
				case 0:
					readyAtV1(i, m)
				case 1, 2:
					m.given(workerV1).working(lcmv1.MachineStateDeploy)
				case 3:
					m.given(workerV1) // handed out, not seen by its agent yet
				}
			})),
			settings: rolloutSettings{machineType: lcmv1.MachineTypeWorker, phase: lcmv1.StatePhaseDeploy, batch: 4},
			hand:     []string{"worker-004"},
		},
		{
			name: "a full window starts nobody",
			cluster: clusterOf(v1, fleet(lcmv1.MachineTypeWorker, 5, func(i int, m *rolloutMachine) {
				prepared(i, m)
				if i < 2 {
					m.given(workerV1).working(lcmv1.MachineStateDeploy)
				}
			})),
			settings: rolloutSettings{machineType: lcmv1.MachineTypeWorker, phase: lcmv1.StatePhaseDeploy, batch: 2},
		},
		{
			name:     "a limit of one deploys a single worker",
			cluster:  clusterOf(v1, fleet(lcmv1.MachineTypeWorker, 5, prepared)),
			settings: firstWorker,
			hand:     []string{"worker-000"},
			waiting:  "0/1 workers Ready",
		},
		{
			name: "a limit counts the workers at work",
			cluster: clusterOf(v1, fleet(lcmv1.MachineTypeWorker, 5, func(i int, m *rolloutMachine) {
				prepared(i, m)
				if i == 3 {
					m.given(workerV1).working(lcmv1.MachineStateDeploy)
				}
			})),
			settings: firstWorker,
		},
		{
			name: "a limit is met by any worker Ready",
			cluster: clusterOf(v1, fleet(lcmv1.MachineTypeWorker, 5, func(i int, m *rolloutMachine) {
				prepared(i, m)
				if i == 4 {
					readyAtV1(i, m)
				}
			})),
			settings: firstWorker,
			done:     true,
		},
		{
			name: "a limit met still lets a worker already at work finish its drain",
			cluster: clusterOf(v2, fleet(lcmv1.MachineTypeWorker, 4, func(i int, m *rolloutMachine) {
				readyAtV1(i, m)
				switch i {
				case 0:
					m.given(workerV2).finished()
				case 3:
					m.cordoned()
				}
			})),
			settings: firstWorker,
			hand:     []string{"worker-003(drain)"},
		},
		{
			name:     "an upgrade drains each deployed worker before its new items",
			cluster:  clusterOf(v2, fleet(lcmv1.MachineTypeWorker, 3, readyAtV1)),
			settings: deployWorkers,
			hand:     []string{"worker-000(drain)", "worker-001(drain)", "worker-002(drain)"},
		},
		{
			name: "a new worker joins without a drain, and so does one without a Node",
			cluster: clusterOf(v2, []*rolloutMachine{
				machineIn("worker-000", lcmv1.MachineTypeWorker).given(prepareOf(workerV2)).finished(),
				machineIn("worker-001", lcmv1.MachineTypeWorker).given(workerV1).finished().noNode(),
			}),
			settings: deployWorkers,
			hand:     []string{"worker-000", "worker-001"},
		},
		{
			name:     "new prepare or reconfigure items on a deployed worker move no workloads",
			cluster:  clusterOf(newPrepareAndReconfigure, fleet(lcmv1.MachineTypeWorker, 1, readyAtV1)),
			settings: deployWorkers,
			hand:     []string{"worker-000"},
		},
		{
			name:     "managers are upgraded one at a time without a drain",
			cluster:  clusterOf(v2, fleet(lcmv1.MachineTypeManager, 2, readyAtV1)),
			settings: deployManagers,
			hand:     []string{"manager-000"},
		},
		{
			name: "a cordoned worker holds its slot and goes on draining",
			cluster: clusterOf(v2, fleet(lcmv1.MachineTypeWorker, 3, func(i int, m *rolloutMachine) {
				readyAtV1(i, m)
				if i == 1 {
					m.cordoned()
				}
			})),
			settings: rolloutSettings{machineType: lcmv1.MachineTypeWorker, phase: lcmv1.StatePhaseDeploy, batch: 2},
			hand:     []string{"worker-001(drain)", "worker-000(drain)"},
		},
		{
			name: "a worker Ready again is uncordoned, and the stage is done only after",
			cluster: clusterOf(v2, fleet(lcmv1.MachineTypeWorker, 2, func(i int, m *rolloutMachine) {
				m.given(workerV2).finished()
				if i == 1 {
					m.cordoned()
				}
			})),
			settings: deployWorkers,
			release:  []string{"worker-001"},
		},
		{
			name: "a machine with only a settled prepare is not Ready for a deploy stage",
			cluster: clusterOf(v1, fleet(lcmv1.MachineTypeWorker, 1, func(i int, m *rolloutMachine) {
				m.given(workerV1).finished()
				m.Status.State = lcmv1.MachineStateDeploy
			})),
			settings: deployWorkers,
			waiting:  "0/1 workers Ready, 1 at work",
		},
		{
			name:     "a missing LCMCluster is waited for",
			cluster:  rolloutCluster{Namespace: "ns", Name: "east"},
			settings: deployAll,
			waiting:  "waiting for LCMCluster/ns/east to exist",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			step := planRollout(tc.cluster, tc.settings)
			if got := handedOut(step); !slices.Equal(got, tc.hand) {
				t.Errorf("hand-outs = %v, want %v", got, tc.hand)
			}
			if got := names(step.Release); !slices.Equal(got, tc.release) {
				t.Errorf("released = %v, want %v", got, tc.release)
			}
			if step.Done != tc.done {
				t.Errorf("done = %v, want %v (waiting: %q)", step.Done, tc.done, step.Waiting)
			}
			if tc.waiting != "" && !slices.ContainsFunc(step.Waiting, func(w string) bool { return strings.Contains(w, tc.waiting) }) {
				t.Errorf("waiting = %q, want one to hold %q", step.Waiting, tc.waiting)
			}
			if step.Done && len(step.Waiting) > 0 {
				t.Errorf("done, yet waiting for %q", step.Waiting)
			}
		})
	}
}

// TestRolloutPlanTargets pins which items each phase hands a machine.
func TestRolloutPlanTargets(t *testing.T) {
	deployed := machineIn("worker-000", lcmv1.MachineTypeWorker).given(workerV1).finished()
	step := planRollout(clusterOf(v2, []*rolloutMachine{deployed}), prepareAll)
	if len(step.HandOuts) != 1 {
		t.Fatalf("hand-outs = %v, want worker-000", handedOut(step))
	}
	want := append(prepareOf(workerV2), workerV1[1:]...)
	if got := step.HandOuts[0].Items; !sameItems(got, want) {
		t.Errorf("prepare of a deployed worker hands %v, want the new prepare items and its deploy items as they were: %v", got, want)
	}
	step = planRollout(clusterOf(v2, []*rolloutMachine{deployed}), deployWorkers)
	if got := step.HandOuts[0].Items; !sameItems(got, workerV2) {
		t.Errorf("deploy hands %v, want the LCMCluster's worker items %v", got, workerV2)
	}
}

// TestRolloutWalk plays whole rollouts turn by turn, an agent finishing a
// random part of the machines at work after each turn, and checks on every
// turn the rules of seed 003: never two managers at work, never more
// workers at work than the batch, no worker before the managers are done,
// and no new deploy items on a deployed worker before its Node is cordoned.
func TestRolloutWalk(t *testing.T) {
	profile := []rolloutSettings{prepareAll, deployManagers, firstWorker, {machineType: lcmv1.MachineTypeWorker, phase: lcmv1.StatePhaseDeploy, batch: 7}}
	for _, walk := range []struct {
		name    string
		from    func(int, *rolloutMachine)
		cluster *lcmv1.LCMCluster
		stages  []rolloutSettings
	}{
		{"deployment, profile stages", nil, v1, profile},
		{"deployment, one stage over every type", nil, v1, []rolloutSettings{{phase: lcmv1.StatePhaseDeploy, batch: 7}}},
		{"upgrade, profile stages", readyAtV1, v2, profile},
	} {
		t.Run(walk.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			machines := append(fleet(lcmv1.MachineTypeManager, 3, walk.from), fleet(lcmv1.MachineTypeWorker, 40, walk.from)...)
			maxWorkers := 0
			for _, s := range walk.stages {
				for turn := 0; ; turn++ {
					if turn > 1000 {
						t.Fatalf("stage %+v not done after 1000 turns", s)
					}
					step := planRollout(clusterOf(walk.cluster, machines), s)
					if step.Done {
						break
					}
					byName := map[string]*rolloutMachine{}
					for _, m := range machines {
						byName[m.Name] = m
					}
					for _, m := range step.Release {
						byName[m.Name].DrainMark = ""
					}
					for _, h := range step.HandOuts {
						m := byName[h.Machine.Name]
						if h.Drain {
							m.DrainMark = drainMarkCordoned // the drain is instant here
						} else if needsDrain(m.LCMMachine, h.Items) && m.DrainMark == "" {
							t.Fatalf("%s gets new deploy items without a drain", m.Name)
						}
						m.given(h.Items)
					}
					var managers, workers int
					for _, m := range machines {
						if !disrupting(m.LCMMachine) && m.DrainMark == "" {
							continue
						}
						if m.Spec.Type == lcmv1.MachineTypeManager {
							managers++
						} else {
							workers++
						}
					}
					if managers > 1 {
						t.Fatalf("turn %d: %d managers at work", turn, managers)
					}
					if workers > s.batch {
						t.Fatalf("turn %d: %d workers at work, batch %d", turn, workers, s.batch)
					}
					if workers > 0 && s.machineType == "" {
						for _, m := range machines {
							if m.Spec.Type == lcmv1.MachineTypeManager && progressOf(m.LCMMachine, desiredItems(walk.cluster, m.Spec.Type), lcmv1.StatePhaseDeploy) != progressDone {
								t.Fatalf("turn %d: workers at work before manager %s is done", turn, m.Name)
							}
						}
					}
					maxWorkers = max(maxWorkers, workers)
					// The agents finish some of their work.
					for _, m := range machines {
						if !settled(m.LCMMachine) && rng.IntN(3) == 0 {
							m.finished()
						}
					}
				}
			}
			for _, m := range machines {
				if p := progressOf(m.LCMMachine, desiredItems(walk.cluster, m.Spec.Type), lcmv1.StatePhaseDeploy); p != progressDone || m.DrainMark != "" {
					t.Errorf("%s: progress %d, drain mark %q after the last stage; want done and uncordoned", m.Name, p, m.DrainMark)
				}
			}
			if maxWorkers < 2 {
				t.Errorf("at most %d workers at work at once: no batching happened", maxWorkers)
			}
		})
	}
}

func TestRolloutSettings(t *testing.T) {
	cases := []struct {
		name    string
		spec    *capstanv1.RolloutSpec
		want    rolloutSettings
		wantErr string
	}{
		{"no settings deploy every machine, 50 workers at once", nil, rolloutSettings{phase: lcmv1.StatePhaseDeploy, batch: 50}, ""},
		{"every setting is read", &capstanv1.RolloutSpec{MachineType: "worker", Phase: "prepare", BatchSize: ptr.To[int32](7), Limit: ptr.To[int32](1)},
			rolloutSettings{machineType: lcmv1.MachineTypeWorker, phase: lcmv1.StatePhasePrepare, batch: 7, limit: 1}, ""},
		{"every bad setting is reported", &capstanv1.RolloutSpec{MachineType: "etcd", Phase: "reconfigure", BatchSize: ptr.To[int32](0), Limit: ptr.To[int32](-1)},
			rolloutSettings{}, `rollout.machineType: "etcd" is neither manager nor worker` + "\n" +
				`rollout.phase: "reconfigure" is neither prepare nor deploy` + "\n" +
				"rollout.batchSize: 0, want at least 1\nrollout.limit: -1, want at least 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := rolloutSettingsOf(&Stage{StageSpec: capstanv1.StageSpec{Name: "S", Action: capstanv1.StageActionRollout, Rollout: tc.spec}})
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("settings = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestRolloutPolicyReachesStages pins that spec.rollout.workerBatchSize
// reaches the rollout stages that set no batch of their own, without
// changing the profile or the deployment's stages.
func TestRolloutPolicyReachesStages(t *testing.T) {
	spec := capstanv1.ClusterDeploymentSpec{Profile: "lcm", Rollout: &capstanv1.RolloutPolicy{WorkerBatchSize: ptr.To[int32](7)}}
	specs, err := StageSpecs(spec)
	if err != nil {
		t.Fatal(err)
	}
	rollouts := 0
	for _, s := range specs {
		if s.Action != capstanv1.StageActionRollout {
			continue
		}
		rollouts++
		if s.Rollout == nil || s.Rollout.BatchSize == nil || *s.Rollout.BatchSize != 7 {
			t.Errorf("stage %s rollout = %+v, want batchSize 7", s.Name, s.Rollout)
		}
	}
	if rollouts == 0 {
		t.Fatal("the lcm profile has no rollout stage")
	}
	again, err := LoadProfile("lcm")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range again.Stages {
		if s.Rollout != nil && s.Rollout.BatchSize != nil {
			t.Errorf("the embedded profile changed: stage %s has batchSize %d", s.Name, *s.Rollout.BatchSize)
		}
	}
	own := []capstanv1.StageSpec{{Name: "W", Action: capstanv1.StageActionRollout, Rollout: &capstanv1.RolloutSpec{BatchSize: ptr.To[int32](3)}}}
	got, err := StageSpecs(capstanv1.ClusterDeploymentSpec{Stages: own, Rollout: spec.Rollout})
	if err != nil {
		t.Fatal(err)
	}
	if *got[0].Rollout.BatchSize != 3 {
		t.Errorf("a stage's own batchSize became %d, want 3 kept", *got[0].Rollout.BatchSize)
	}
}
