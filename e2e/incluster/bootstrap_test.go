package incluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	corev1 "k8s.io/api/core/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/sim"
	"github.com/capstan-dev/capstan/internal/sopstest"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/render"
	"github.com/capstan-dev/capstan/stages"
	"github.com/capstan-dev/capstan/stages/pivot"
)

// flowTimeout bounds each phase of the bootstrap flow: sixteen stages,
// two control planes, simulators and a real pod share two cores with
// whatever else runs here.
const flowTimeout = 10 * time.Minute

// bootFlow is examples/clusters/bootstrap as TestBootstrapProfileHandsOverToThePod
// runs it: every namespace the example names is renamed after ns, so that
// the test's objects are its own in the suite's shared cluster.
type bootFlow struct {
	ns, clusterNS, provNS string
	// targetNS are the example's capi-system, helm-system and iam, renamed:
	// where stages 6-8 and 11-16 act in the target.
	targetNS     map[string]string
	cd           *capstanv1.ClusterDeployment
	bc, tc       client.Client // the bootstrap cluster, the suite's (the target)
	bcfg         *rest.Config
	kubeconfig   []byte // the target's, which the simulated KubeadmControlPlane writes
	hostPassword string // the BMC and IAM passwords of the test's copy
	demoKey      []byte // the examples' age key, which the copy is encrypted for
	log          *syncBuffer
	started      time.Time
}

func (b *bootFlow) name() string { return b.cd.Name }

func (b *bootFlow) cluster() string { return b.cd.Spec.Substitute["CLUSTER_NAME"] }

// TestBootstrapProfileHandsOverToThePod is issue 12's full flow with a
// real handover: examples/clusters/bootstrap (the bootstrap profile's
// sixteen stages) run by `capstan run --image`, a process against a
// bootstrap control plane, with the suite's cluster (a real node) as the
// new cluster. The simulated providers play Cluster API and Metal3 in both
// clusters, the simulated KubeadmControlPlane writes the suite's
// kubeconfig as the new cluster's; the pivot moves the deployment into the
// suite's cluster and installs Capstan's image there, and the pod the node
// starts finishes stages 11-16. In the end every stage is Ready in the
// target, whose Capstan owns the deployment and holds its fencing record;
// every moved object is there once, its owners remapped; the bootstrap
// keeps only the mirrors, whose status follows the target's; no Secret
// value is in either daemon's log.
func TestBootstrapProfileHandsOverToThePod(t *testing.T) {
	if !cl.HostNetwork() {
		t.Skipf("backend %T: the installed Capstan must reach the API server at the kubeconfig's address, which only host-network nodes do", cl)
	}
	b := exampleFlow(t, "bootstrap-e2e")
	b.tc = newClient(t)
	var err error
	if b.kubeconfig, err = os.ReadFile(cl.KubeconfigPath()); err != nil {
		t.Fatal(err)
	}

	// The move's preflight wants every kind that moves served in the
	// target: the Cluster API and Metal3 CRDs, as the new cluster's Helm
	// bundle would install them, and Capstan's (the LCM kinds; the pivot
	// would install them too, but the simulated LCM agents start first).
	begin := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	providers, err := testenv.ProviderCRDDirs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	crdDirs := append([]string{"../../manifests/crds"}, providers...)
	t.Cleanup(func() { b.cleanTargetAfterSimulators(t) })
	if err := testenv.InstallCRDs(ctx, cl.Config(), crdDirs...); err != nil {
		t.Fatalf("install the provider CRDs into the suite's cluster: %v", err)
	}
	// The bootstrap cluster: kube-controller-manager for its providers'
	// Deployments and for the deletion of their namespace.
	benv, err := testenv.Start(ctx, testenv.Options{CRDDirs: crdDirs, ControllerManager: true, Progress: io.Discard})
	if err != nil {
		t.Fatalf("start the bootstrap control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := benv.Stop(); err != nil {
			t.Errorf("stop the bootstrap control plane: %v", err)
		}
	})
	b.bcfg = benv.Config
	if b.bc, err = client.New(benv.Config, client.Options{Scheme: reconciler.Scheme()}); err != nil {
		t.Fatal(err)
	}
	t.Logf("bootstrap control plane started and CRDs served in both clusters in %s", time.Since(begin).Round(time.Millisecond))

	b.simulate(t, "bootstrap", benv.Config, []string{b.provNS}, false)
	// No simulated kubelet in the target: its Deployments run on the node
	// (see exampleFlow).
	b.simulate(t, "target", cl.Config(), nil, true)
	t.Cleanup(func() { b.cleanTarget(t) })

	b.startBootstrapDaemon(t, benv.KubeconfigPath)
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.ns}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "git-auth", Namespace: b.ns},
			StringData: map[string]string{"username": gitUser, "password": gitPassword}},
		// The example's spec.decryption names it.
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sops-age", Namespace: b.ns},
			Data: map[string][]byte{"demo.agekey": b.demoKey}},
		b.cd,
	} {
		if err := b.bc.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	b.started = time.Now()
	b.follow(t)
	t.Cleanup(func() {
		if t.Failed() {
			b.dump(t)
		}
	})

	// Stages 1-8 by the bootstrap's Capstan, 6-8 acting on the target.
	b.waitDeployment(t, "bootstrap", b.bc, "stages 1-8 Ready", func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "HelmBundleReady").State == capstanv1.StageReady
	})
	t.Logf("bootstrap: stages 1-8 Ready %s after create", b.since())
	moved := b.waitDeployment(t, "bootstrap", b.bc, "the move done (status.pivot past CleanSource)", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.Pivot != nil && slices.Contains([]capstanv1.PivotPhase{
			capstanv1.PivotSourceCleaned, capstanv1.PivotInstalled, capstanv1.PivotHandedOver, capstanv1.PivotCleanedUp,
		}, cd.Status.Pivot.Phase)
	})
	t.Logf("bootstrap: moved %d objects into %s %s after create", moved.Status.Pivot.Objects, moved.Status.Pivot.Target, b.since())

	// Stages 11-16 by the installed pod.
	done := b.waitDeployment(t, "target", b.tc, "every stage Ready in the target", func(cd *capstanv1.ClusterDeployment) bool {
		c := condition(cd, capstanv1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == cd.Generation
	})
	t.Logf("target: Ready %s after create (%s)", b.since(), stageDurations(done))
	mirror := b.waitDeployment(t, "bootstrap", b.bc, "PivotDone Ready in the bootstrap (handed over, cleaned up)", func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "PivotDone").State == capstanv1.StageReady && cd.Status.Pivot != nil && cd.Status.Pivot.Phase == capstanv1.PivotCleanedUp
	})
	t.Logf("bootstrap: handed over and cleaned up %s after create", b.since())

	for _, st := range done.Status.Stages {
		if st.State != capstanv1.StageReady {
			t.Errorf("target: stage %s is %s: %s", st.Name, st.State, st.Message)
		}
	}
	if want := profileStageNames(t); !slices.Equal(stageNames(done), want) {
		t.Errorf("target: stages %v, want the bootstrap profile's %v", stageNames(done), want)
	}
	b.assertOwnedByThePod(t, done, mirror)
	if !mirror.Spec.Suspend || mirror.Annotations[pivot.MirrorAnnotation] == "" {
		t.Errorf("bootstrap: the deployment is not a suspended mirror (suspend %t, annotations %v)", mirror.Spec.Suspend, mirror.Annotations)
	}
	b.assertMovedOnce(t, mirror)
	b.assertOnlyMirrorsLeft(t)
	b.assertMirrorsFollow(t, mirror)
	b.assertNoSecretInLogs(t)
}

// exampleFlow commits examples/clusters/bootstrap and the bases it uses
// to a new repository of the suite's git server, with every namespace
// renamed after ns, and returns the deployment that reads it.
//
// The example's controllers in the new cluster (its Helm bundle's Cluster
// API and Metal3 Deployments, the helm-controller) name images of
// registries the node cannot pull from. They run for real on the node
// instead, as the node's pause program (testenv.PauseImage, which the
// node has imported for its sandboxes and which ignores their arguments):
// a patch in the test's copy of the overlay sets that image,
// imagePullPolicy Never, host networking (the node has no CNI) and the
// tolerations of a node without a network. The suite's
// kube-controller-manager, kube-scheduler and kubelet then make the
// Deployments' status, as in a real cluster. (The simulated kubelet,
// binding them to a fake Node, would add a Node to the shared cluster and
// would get them only as long as the real scheduler finds no node for
// them: the real node's not-ready taint keeps them off it today, the fake
// Node's lack of allocatable pods off the fake one.) The bootstrap's own
// providers stay as the example has them: the bootstrap control plane has
// no node, and a simulated kubelet runs their pods.
func exampleFlow(t *testing.T, ns string) *bootFlow {
	t.Helper()
	b := &bootFlow{ns: ns, clusterNS: ns + "-central", provNS: ns + "-providers", targetNS: map[string]string{
		"capi-system": ns + "-capi", "helm-system": ns + "-helm", "iam": ns + "-iam",
	}, hostPassword: "bmc-" + randomHex(t)}
	files := map[string]string{}
	for _, dir := range []string{"bases/metal3-cluster", "bases/providers", "clusters/bootstrap"} {
		root := filepath.Join("..", "..", "examples")
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			content, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(root, path)
			files[filepath.ToSlash(rel)] = string(content)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// The example's credentials are sops-encrypted for the demo key: the
	// test's copy is decrypted, rewritten below, and encrypted again for
	// it before the commit, as an operator's `sops edit` would.
	demoKeyFile, err := os.ReadFile("../../examples/DEMO-KEY-NOT-SECRET.agekey")
	if err != nil {
		t.Fatal(err)
	}
	b.demoKey = demoKeyFile
	keys, err := render.ParseKeys(map[string][]byte{"demo.agekey": demoKeyFile})
	if err != nil {
		t.Fatal(err)
	}
	encrypted := map[string]bool{}
	for file, content := range files {
		if !sopstest.IsEncrypted([]byte(content)) {
			continue
		}
		plain, err := render.DecryptFile(file, []byte(content), keys)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		files[file], encrypted[file] = string(plain), true
	}
	const overlay = "clusters/bootstrap/overlay/"
	rename := map[string][2]string{
		overlay + "cluster/kustomization.yaml":   {"namespace: central", "namespace: " + b.clusterNS},
		overlay + "cluster/namespace.yaml":       {"name: central", "name: " + b.clusterNS},
		overlay + "bootstrap/kustomization.yaml": {"namespace: bootstrap-providers", "namespace: " + b.provNS},
		overlay + "bootstrap/namespace.yaml":     {"name: bootstrap-providers", "name: " + b.provNS},
	}
	for file, r := range rename {
		if !strings.Contains(files[file], r[0]) {
			t.Fatalf("%s no longer says %q", file, r[0])
		}
		files[file] = strings.Replace(files[file], r[0], r[1], 1)
	}
	// The new cluster's namespaces, wherever a name or namespace field says
	// one of them.
	targetField := regexp.MustCompile(`(?m)^(\s*(?:name|namespace): )(capi-system|helm-system|iam)\s*$`)
	renamed := map[string]bool{}
	for file, content := range files {
		if strings.HasPrefix(file, overlay+"target/") {
			files[file] = targetField.ReplaceAllStringFunc(content, func(m string) string {
				sub := targetField.FindStringSubmatch(m)
				renamed[sub[2]] = true
				return sub[1] + b.targetNS[sub[2]]
			})
		}
	}
	for old := range b.targetNS {
		if !renamed[old] {
			t.Fatalf("%starget/ no longer names namespace %s", overlay, old)
		}
	}
	const targetKustomization = overlay + "target/kustomization.yaml"
	if strings.Contains(files[targetKustomization], "patches:") {
		t.Fatalf("%s has patches now: merge the node's patch below into them", targetKustomization)
	}
	files[targetKustomization] += `# e2e/incluster: the node runs the new cluster's controllers as its pause program.
patches:
  - target: {group: apps, kind: Deployment}
    patch: |
      - {op: replace, path: /spec/template/spec/containers/0/image, value: "` + testenv.PauseImage + `"}
      - {op: add, path: /spec/template/spec/containers/0/imagePullPolicy, value: Never}
      - {op: add, path: /spec/template/spec/hostNetwork, value: true}
      - op: add
        path: /spec/template/spec/tolerations
        value:
          - {key: node.kubernetes.io/not-ready, operator: Exists}
          - {key: node.kubernetes.io/network-unavailable, operator: Exists}
  # The helm-controller reads helm-controller-config, which only
  # HelmControllerConfigUpdated (stage 14) applies: a real kubelet does not
  # start it before (CreateContainerConfigError), and HelmBundleReady
  # (stage 8) waits for it forever. Until the example ships a first
  # configuration with the bundle, the reference is optional here.
  - target: {group: apps, kind: Deployment, name: helm-controller}
    patch: |
      - {op: add, path: /spec/template/spec/containers/0/envFrom/0/configMapRef/optional, value: true}
`
	// Secret values of the test's own, to look for in the logs.
	replaced := 0
	demoPassword := regexp.MustCompile(`password: demo-password-\S+`)
	for file, content := range files {
		replaced += len(demoPassword.FindAllString(content, -1))
		files[file] = demoPassword.ReplaceAllString(content, "password: "+b.hostPassword)
	}
	if replaced == 0 {
		t.Fatal("the example's Secrets no longer say password: demo-password-...")
	}
	ids, err := age.ParseIdentities(bytes.NewReader(demoKeyFile))
	if err != nil || len(ids) != 1 {
		t.Fatalf("the demo key: %d identities, %v", len(ids), err)
	}
	for file := range encrypted {
		files[file] = sopstest.EncryptSecretYAML(t, files[file], ids[0].(*age.X25519Identity))
	}

	repo := ns + "-" + randomHex(t) // one per run: -count=2 runs twice against one git server
	if _, err := gitSrv.CreateRepo(repo); err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(repo, "main", files, "the bootstrap example"); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("../../examples/clusters/bootstrap/clusterdeployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b.cd = &capstanv1.ClusterDeployment{}
	if err := yaml.UnmarshalStrict(raw, b.cd); err != nil {
		t.Fatalf("examples/clusters/bootstrap/clusterdeployment.yaml: %v", err)
	}
	b.cd.Namespace = ns
	// The installed pod reads the repository as the bootstrap daemon does.
	b.cd.Spec.Source = &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
		URL: strings.Replace(gitSrv.HTTPURL(repo), "127.0.0.1", cl.HostAddress(), 1), Ref: capstanv1.GitRef{Branch: "main"},
		SecretRef: &capstanv1.LocalObjectReference{Name: "git-auth"},
	}}
	return b
}

func randomHex(t *testing.T) string {
	t.Helper()
	p := make([]byte, 8)
	if _, err := rand.Read(p); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(p)
}

// simulate plays in one cluster the providers of the new cluster's
// namespace (the KubeadmControlPlane writing the suite's kubeconfig as
// the new cluster's), a kubelet for the pods of kubeletNS if any, and,
// with lcm, the LCM agents of the new cluster's machines; until the test
// ends.
func (b *bootFlow) simulate(t *testing.T, side string, cfg *rest.Config, kubeletNS []string, lcm bool) {
	t.Helper()
	opts := sim.TestOptions(b.clusterNS)
	opts.Kubeconfig = func(cluster types.NamespacedName) []byte {
		if cluster.Name != b.cluster() {
			return nil
		}
		return b.kubeconfig
	}
	s, err := sim.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, side+" simulator", s.Run)
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	if len(kubeletNS) > 0 {
		runUntilCleanup(t, side+" kubelet", sim.NewKubelet(c, sim.KubeletOptions{Namespaces: kubeletNS, NodeName: "sim-" + side + "-" + b.ns}).Run)
	}
	if lcm {
		lopts := sim.DefaultLCMOptions()
		lopts.Namespace = b.clusterNS
		runUntilCleanup(t, side+" LCM agents", sim.NewLCMAgent(c, lopts).Run)
	}
}

// runUntilCleanup runs a simulated component until the test ends.
func runUntilCleanup(t *testing.T, what string, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("%s: %v", what, err)
		}
	})
}

// startBootstrapDaemon runs `capstan run` against the bootstrap cluster
// as a process, as on a bootstrap host, knowing its image, which it
// installs into the target; it refreshes the mirrors every 2 s.
func (b *bootFlow) startBootstrapDaemon(t *testing.T, kubeconfig string) {
	t.Helper()
	b.log = &syncBuffer{}
	cmd := exec.Command(binPath, "run", "--kubeconfig", kubeconfig,
		"--image", imageRef, "--cluster-name", "bootstrap",
		"--pivot-metrics-port", strconv.Itoa(freePort(t)), "--pivot-health-port", strconv.Itoa(freePort(t)),
		"--mirror-interval", "2s", "--wait-slice", "3s",
		"--leader-elect=false", "--metrics-addr", "0", "--health-addr", "0", "--log-format", "text")
	cmd.Stdout, cmd.Stderr = b.log, b.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
}

func (b *bootFlow) since() time.Duration { return time.Since(b.started).Round(100 * time.Millisecond) }

// waitDeployment polls the deployment in one cluster until cond holds,
// failing the test after flowTimeout with its status as last seen.
func (b *bootFlow) waitDeployment(t *testing.T, side string, c client.Client, what string, cond func(*capstanv1.ClusterDeployment) bool) *capstanv1.ClusterDeployment {
	t.Helper()
	deadline := time.Now().Add(flowTimeout)
	last := ""
	for {
		cd := &capstanv1.ClusterDeployment{}
		err := c.Get(t.Context(), client.ObjectKey{Namespace: b.ns, Name: b.name()}, cd)
		if err == nil && cond(cd) {
			return cd
		}
		if err != nil {
			last = err.Error()
		} else {
			last = describeCD(cd)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s: not after %s; last seen: %s", side, what, flowTimeout, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// follow logs, until the test ends, each stage change of the deployment
// in either cluster with the time since it was created: a red run says
// where it stopped, a green one how long each part took.
func (b *bootFlow) follow(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := map[string]string{}
		for ctx.Err() == nil {
			for side, c := range map[string]client.Client{"bootstrap": b.bc, "target": b.tc} {
				cd := &capstanv1.ClusterDeployment{}
				if c.Get(ctx, client.ObjectKey{Namespace: b.ns, Name: b.name()}, cd) != nil {
					continue
				}
				now, msg := "every stage Ready", ""
				if len(cd.Status.Stages) == 0 {
					now = "no stage yet"
				}
				for _, st := range cd.Status.Stages {
					if st.State != capstanv1.StageReady {
						now, msg = st.Name+" "+string(st.State), st.Message
						break
					}
				}
				if p := cd.Status.Pivot; p != nil {
					now += ", pivot " + string(p.Phase)
				}
				if now != last[side] {
					last[side] = now
					t.Logf("%s at %s: %s %.200s", side, b.since(), now, msg)
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// dump logs what explains a failure: both deployments, both daemons' log
// tails, the target's pods of the test.
func (b *bootFlow) dump(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for side, c := range map[string]client.Client{"bootstrap": b.bc, "target": b.tc} {
		cd := &capstanv1.ClusterDeployment{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: b.ns, Name: b.name()}, cd); err != nil {
			t.Logf("%s deployment: %v", side, err)
			continue
		}
		t.Logf("%s deployment: %s; status.pivot %+v", side, describeCD(cd), cd.Status.Pivot)
	}
	t.Logf("bootstrap daemon log:\n%s", tail(b.log.String(), 80))
	var pods corev1.PodList
	if err := b.tc.List(ctx, &pods); err == nil {
		for _, p := range pods.Items {
			if p.Namespace != capstanNS && !slices.Contains(slices.Collect(maps.Values(b.targetNS)), p.Namespace) {
				continue
			}
			why := ""
			for _, c := range p.Status.Conditions {
				if c.Status != corev1.ConditionTrue && c.Message != "" {
					why += fmt.Sprintf("; %s: %s", c.Type, c.Message)
				}
			}
			for _, c := range p.Status.ContainerStatuses {
				if w := c.State.Waiting; w != nil {
					why += fmt.Sprintf("; container %s waiting: %s: %s", c.Name, w.Reason, w.Message)
				}
			}
			t.Logf("target pod %s/%s on %q: %s%s", p.Namespace, p.Name, p.Spec.NodeName, p.Status.Phase, why)
			if p.Namespace == capstanNS {
				logs, err := cl.PodLogs(ctx, capstanNS, p.Name, "capstan")
				t.Logf("installed daemon %s log (%v):\n%s", p.Name, err, tail(logs, 80))
			}
		}
	}
}

func describeCD(cd *capstanv1.ClusterDeployment) string {
	s := fmt.Sprintf("revision=%s suspend=%t", cd.Status.Revision, cd.Spec.Suspend)
	for _, st := range cd.Status.Stages {
		s += fmt.Sprintf(" [%s %s attempts=%d %q]", st.Name, st.State, st.Attempts, st.Message)
	}
	for _, c := range cd.Status.Conditions {
		s += fmt.Sprintf(" %s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message)
	}
	return s
}

func condition(cd *capstanv1.ClusterDeployment, typ string) *metav1.Condition {
	for i := range cd.Status.Conditions {
		if cd.Status.Conditions[i].Type == typ {
			return &cd.Status.Conditions[i]
		}
	}
	return nil
}

func stageDurations(cd *capstanv1.ClusterDeployment) string {
	var parts []string
	for _, st := range cd.Status.Stages {
		if st.StartedAt != nil && st.FinishedAt != nil {
			parts = append(parts, fmt.Sprintf("%s %s", st.Name, st.FinishedAt.Sub(st.StartedAt.Time)))
		}
	}
	return strings.Join(parts, ", ")
}

func stageNames(cd *capstanv1.ClusterDeployment) []string {
	var names []string
	for _, st := range cd.Status.Stages {
		names = append(names, st.Name)
	}
	return names
}

func profileStageNames(t *testing.T) []string {
	t.Helper()
	p, err := stages.LoadProfile("bootstrap")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range p.Stages {
		names = append(names, s.Name)
	}
	return names
}

// assertOwnedByThePod: the target's Capstan, the pod the pivot installed,
// running the suite's image on the node, leads there, owns the deployment
// (status.pivot.owner in both clusters) and holds its fencing record in
// both; the new cluster's controllers run on the same node.
func (b *bootFlow) assertOwnedByThePod(t *testing.T, done, mirror *capstanv1.ClusterDeployment) {
	t.Helper()
	ctx := t.Context()
	targetID, err := pivot.ClusterID(ctx, b.tc)
	if err != nil {
		t.Fatal(err)
	}
	pod := daemonPod(t, b.tc)
	node := &corev1.Node{}
	if err := b.tc.Get(ctx, client.ObjectKey{Name: pod.Spec.NodeName}, node); err != nil {
		t.Fatalf("the installed pod's node %q: %v", pod.Spec.NodeName, err)
	}
	if _, simulated := node.Labels[sim.LCMNodeMachineLabel]; simulated || pod.Spec.Containers[0].Image != imageRef || !podReady(pod) {
		t.Errorf("installed pod %s: node %s (labels %v), image %q, ready %t; want the suite's image ready on the suite's node",
			pod.Name, node.Name, node.Labels, pod.Spec.Containers[0].Image, podReady(pod))
	}
	if holder := leaseHolder(t, b.tc); !strings.HasPrefix(holder, pod.Name) {
		t.Errorf("leader Lease held by %q, want the installed pod %s", holder, pod.Name)
	}
	for _, cd := range []*capstanv1.ClusterDeployment{done, mirror} {
		if cd.Status.Pivot == nil || cd.Status.Pivot.Owner != targetID {
			t.Errorf("status.pivot = %+v; want it owned by the target (%s)", cd.Status.Pivot, targetID)
		}
	}
	for side, c := range map[string]client.Client{"bootstrap": b.bc, "target": b.tc} {
		holder, err := pivot.FenceHolder(ctx, c, b.ns, b.name())
		if err != nil || holder != targetID {
			t.Errorf("%s: fencing Lease %s/%s held by %q (%v); want the target's Capstan (%s)", side, b.ns, pivot.FenceName(b.name()), holder, err, targetID)
		}
	}
	var pods corev1.PodList
	if err := b.tc.List(ctx, &pods, client.InNamespace(b.targetNS["capi-system"])); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) == 0 {
		t.Errorf("no pod of the new cluster's providers in %s after ControllersEnabledAfterPivot", b.targetNS["capi-system"])
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName != pod.Spec.NodeName || !podReady(&p) {
			t.Errorf("provider pod %s: node %q, phase %s; want it ready on %s", p.Name, p.Spec.NodeName, p.Status.Phase, pod.Spec.NodeName)
		}
	}
}

// isMirror reports whether the bootstrap keeps o after the move: the
// deployment, the Cluster API Clusters and Machines, and the target's
// kubeconfig Secret to reach it through.
func (b *bootFlow) isMirror(o pivot.Object) bool {
	switch o.Kind {
	case "ClusterDeployment":
		return o.Namespace == b.ns && o.Name == b.name()
	case "Cluster", "Machine":
		return strings.HasPrefix(o.APIVersion, "cluster.x-k8s.io/")
	case "Secret":
		return o.Namespace == b.clusterNS && o.Name == sim.KubeconfigSecretName(b.cluster())
	}
	return false
}

// assertMovedOnce: the deployment's graph as the target holds it, less
// what stages 6-8 and 14 applied there, is as many objects as the move
// recorded; every owner reference there names an object there (the UIDs
// remapped); and, but for the mirrors, none of them is left in the
// bootstrap.
func (b *bootFlow) assertMovedOnce(t *testing.T, mirror *capstanv1.ClusterDeployment) {
	t.Helper()
	ctx := t.Context()
	all, roots, err := pivot.Discover(ctx, b.tc, discovery.NewDiscoveryClientForConfigOrDie(cl.Config()), b.ns, b.name())
	if err != nil {
		t.Fatal(err)
	}
	appliedThere := map[string]bool{"ObjectsCreated": true, "ProviderConfigured": true, "HelmBundleReady": true, "HelmControllerConfigUpdated": true}
	uids := map[types.UID]bool{}
	byID := map[pivot.Object]*unstructured.Unstructured{}
	for _, u := range all {
		uids[u.GetUID()] = true
		byID[pivot.ObjectOf(u)] = u
	}
	var movedRoots []pivot.Object
	for _, r := range roots {
		if u := byID[r]; u == nil || !appliedThere[u.GetLabels()[stages.StageKey]] {
			movedRoots = append(movedRoots, r)
		}
	}
	g, err := pivot.BuildGraph(all, movedRoots)
	if err != nil {
		t.Fatal(err)
	}
	if mirror.Status.Pivot == nil || int(mirror.Status.Pivot.Objects) != g.Len() {
		t.Errorf("the target holds %d objects of the move; the bootstrap recorded %+v", g.Len(), mirror.Status.Pivot)
	}
	var kept []string
	for _, n := range g.Nodes() {
		id := n.ID()
		for _, ref := range n.Object.GetOwnerReferences() {
			if !uids[ref.UID] {
				t.Errorf("%s in the target: owner %s %s has UID %s, which no object there has", id, ref.Kind, ref.Name, ref.UID)
			}
		}
		left := &unstructured.Unstructured{}
		left.SetGroupVersionKind(n.Object.GroupVersionKind())
		err := b.bc.Get(ctx, client.ObjectKey{Namespace: id.Namespace, Name: id.Name}, left)
		switch {
		case err == nil && b.isMirror(id):
			kept = append(kept, id.String())
			if left.GetAnnotations()[pivot.MirrorAnnotation] == "" || len(left.GetOwnerReferences()) > 0 {
				t.Errorf("the mirror %s in the bootstrap: annotations %v, owners %v; want %s and no owner", id,
					left.GetAnnotations(), left.GetOwnerReferences(), pivot.MirrorAnnotation)
			}
		case err == nil:
			t.Errorf("%s moved, and is still in the bootstrap", id)
		case !apierrors.IsNotFound(err):
			t.Errorf("%s in the bootstrap: %v", id, err)
		case b.isMirror(id):
			t.Errorf("%s moved, and its mirror is not in the bootstrap", id)
		}
	}
	slices.Sort(kept)
	t.Logf("moved %d objects; mirrors kept in the bootstrap: %s", g.Len(), strings.Join(kept, ", "))
}

// assertOnlyMirrorsLeft: of everything that can move, the bootstrap keeps
// in the deployment's namespaces only the mirrors and what Kubernetes puts
// in every namespace; its providers (bootstrap-only) are gone with their
// namespace.
func (b *bootFlow) assertOnlyMirrorsLeft(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	left, err := pivot.List(ctx, b.bc, discovery.NewDiscoveryClientForConfigOrDie(b.bcfg), []string{b.ns, b.clusterNS, b.provNS})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range left {
		if id := pivot.ObjectOf(u); !b.isMirror(id) && !(id.Kind == "ConfigMap" && id.Name == "kube-root-ca.crt") {
			t.Errorf("the bootstrap still holds %s", id)
		}
	}
	for side, c := range map[string]client.Client{"bootstrap": b.bc, "target": b.tc} {
		ns := &corev1.Namespace{}
		if err := c.Get(ctx, client.ObjectKey{Name: b.provNS}, ns); !apierrors.IsNotFound(err) {
			t.Errorf("%s: namespace %s of the bootstrap providers: %v, deleting since %v; want it gone", side, b.provNS, err, ns.DeletionTimestamp)
		}
	}
}

// assertMirrorsFollow waits until the bootstrap's mirrors carry the
// status of their originals in the target, as the refresh copies it: the
// Cluster and Machines theirs (see mirrored), the deployment the target's
// stage states.
func (b *bootFlow) assertMirrorsFollow(t *testing.T, mirror *capstanv1.ClusterDeployment) {
	t.Helper()
	refs := mirror.Status.Pivot.Mirrors
	kinds := map[string]int{}
	for _, r := range refs {
		kinds[r.Kind]++
	}
	if kinds["Cluster"] != 1 || kinds["Machine"] == 0 {
		t.Errorf("status.pivot.mirrors = %v; want the Cluster and its Machines", refs)
	}
	ctx := t.Context()
	begin := time.Now()
	deadline := begin.Add(flowTimeout)
	last := "-"
	for {
		differ := ""
		for _, r := range refs {
			if r.Kind == "ClusterDeployment" {
				continue
			}
			var got [2]*unstructured.Unstructured
			for i, c := range []client.Client{b.bc, b.tc} {
				got[i] = &unstructured.Unstructured{}
				got[i].SetAPIVersion(r.APIVersion)
				got[i].SetKind(r.Kind)
				if err := c.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: r.Name}, got[i]); err != nil {
					differ += fmt.Sprintf("; %s %s: %v", r.Kind, r.Name, err)
				}
			}
			if d := statusDiff(mirrored(got[0]), mirrored(got[1])); d != "" {
				differ += fmt.Sprintf("; %s %s: %s", r.Kind, r.Name, d)
			}
		}
		here, there := &capstanv1.ClusterDeployment{}, &capstanv1.ClusterDeployment{}
		errHere := b.bc.Get(ctx, client.ObjectKey{Namespace: b.ns, Name: b.name()}, here)
		errThere := b.tc.Get(ctx, client.ObjectKey{Namespace: b.ns, Name: b.name()}, there)
		if got, want := stageStates(here), stageStates(there); errHere != nil || errThere != nil || got != want || here.Status.Pivot.MirroredAt == nil {
			differ += fmt.Sprintf("; the deployment's stages here %s, there %s (%v, %v)", got, want, errHere, errThere)
		}
		if differ != last && differ != "" {
			t.Logf("mirrors at %s: %s", b.since(), strings.TrimPrefix(differ, "; "))
			last = differ
		}
		if differ == "" {
			t.Logf("the mirrors follow the target %s after the bootstrap's PivotDone was Ready", time.Since(begin).Round(100*time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("the mirrors do not follow the target after %s%s", flowTimeout, differ)
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func stageStates(cd *capstanv1.ClusterDeployment) string {
	var s []string
	for _, st := range cd.Status.Stages {
		s = append(s, st.Name+"="+string(st.State))
	}
	return strings.Join(s, ",")
}

// statusDiff names the fields of two statuses that differ, and of their
// conditions the types.
func statusDiff(here, there map[string]any) string {
	keys := slices.Collect(maps.Keys(here))
	for k := range there {
		if _, ok := here[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var d []string
	for _, k := range keys {
		if equality.Semantic.DeepEqual(here[k], there[k]) {
			continue
		}
		if k != "conditions" {
			d = append(d, k)
			continue
		}
		byType := func(conds any) map[any]any {
			m := map[any]any{}
			list, _ := conds.([]any)
			for _, c := range list {
				c, _ := c.(map[string]any)
				m[c["type"]] = c
			}
			return m
		}
		h, th := byType(here[k]), byType(there[k])
		for typ := range th {
			if !equality.Semantic.DeepEqual(h[typ], th[typ]) {
				d = append(d, fmt.Sprintf("condition %v", typ))
			}
		}
		for typ := range h {
			if _, ok := th[typ]; !ok {
				d = append(d, fmt.Sprintf("condition %v (only here)", typ))
			}
		}
	}
	if len(d) == 0 {
		return ""
	}
	return "status " + strings.Join(d, ", ") + " differ"
}

// mirrored is what the refresh keeps equal of u's status: all but what
// the simulated Cluster API in the bootstrap, which still runs (as the real
// one would, had it not been scaled down), writes on a paused mirror of
// its own: the Paused condition, and observedGeneration, which counts
// the mirror's generations, not the original's. It writes them right after
// each refresh; comparing them would only catch that race's window.
func mirrored(u *unstructured.Unstructured) map[string]any {
	status, _ := u.Object["status"].(map[string]any)
	status = maps.Clone(status)
	delete(status, "observedGeneration")
	if conds, ok := status["conditions"].([]any); ok {
		status["conditions"] = slices.DeleteFunc(slices.Clone(conds), func(c any) bool {
			m, _ := c.(map[string]any)
			return m["type"] == "Paused"
		})
	}
	return status
}

// assertNoSecretInLogs: the git password, the target's credentials and
// the hosts' and IAM passwords all moved, and none is in either daemon's
// log nor in either deployment's status.
func (b *bootFlow) assertNoSecretInLogs(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	pod := daemonPod(t, b.tc)
	podLog, err := cl.PodLogs(ctx, capstanNS, pod.Name, "capstan")
	if err != nil {
		t.Fatal(err)
	}
	texts := map[string]string{"the bootstrap daemon's log": b.log.String(), "the installed daemon's log": podLog}
	for side, c := range map[string]client.Client{"bootstrap": b.bc, "target": b.tc} {
		cd := &capstanv1.ClusterDeployment{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: b.ns, Name: b.name()}, cd); err != nil {
			t.Fatal(err)
		}
		texts["the "+side+" deployment's status"] = fmt.Sprintf("%+v", cd.Status)
	}
	secrets := secretValues(t, b.kubeconfig)
	secrets["the hosts' and IAM password"] = b.hostPassword
	for where, text := range texts {
		for name, value := range secrets {
			if strings.Contains(text, value) {
				t.Errorf("%s holds %s", where, name)
			}
		}
	}
}

// cleanTarget leaves the suite's cluster as the test found it, while the
// simulators still run: no Capstan (the pivot installed it; uninstall
// takes its CRDs, the deployment and the LCM objects with it), none of
// the test's namespaces.
func (b *bootFlow) cleanTarget(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, binPath, "uninstall", "--force", "--timeout", "3m", "--kubeconfig", cl.KubeconfigPath()).CombinedOutput()
	if err != nil {
		t.Errorf("capstan uninstall after the test: %v\n%s", err, out)
	}
	namespaces := append([]string{b.ns, b.clusterNS, b.provNS}, slices.Collect(maps.Values(b.targetNS))...)
	for _, name := range namespaces {
		if err := b.tc.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete namespace %s: %v", name, err)
		}
	}
	for ctx.Err() == nil {
		left := slices.DeleteFunc(slices.Clone(namespaces), func(name string) bool {
			return apierrors.IsNotFound(b.tc.Get(ctx, client.ObjectKey{Name: name}, &corev1.Namespace{}))
		})
		if len(left) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Errorf("namespaces %v still in the suite's cluster after the test", left)
		case <-time.After(time.Second):
		}
	}
}

// cleanTargetAfterSimulators removes, once the simulators stopped, the
// Nodes the simulated LCM agents registered and the provider CRDs the test
// installed.
func (b *bootFlow) cleanTargetAfterSimulators(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := newClient(t)
	if err := c.DeleteAllOf(ctx, &corev1.Node{}, client.MatchingLabels{sim.LCMNodeNamespaceLabel: b.clusterNS}); err != nil {
		t.Errorf("delete the simulated machines' Nodes: %v", err)
	}
	ext, err := apiextensionsclient.NewForConfig(cl.Config())
	if err != nil {
		t.Fatal(err)
	}
	crds, err := ext.ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Errorf("list CRDs: %v", err)
		return
	}
	var names []string
	for _, crd := range crds.Items {
		if g := crd.Spec.Group; strings.HasSuffix(g, "cluster.x-k8s.io") || strings.HasSuffix(g, "metal3.io") {
			names = append(names, crd.Name)
			if err := ext.ApiextensionsV1().CustomResourceDefinitions().Delete(ctx, crd.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete CRD %s: %v", crd.Name, err)
			}
		}
	}
	for _, name := range names {
		for {
			_, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				break
			}
			if ctx.Err() != nil {
				t.Errorf("CRD %s still in the suite's cluster after the test: %v", name, err)
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
}
