package metal3

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
)

var mdGVK = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "MachineDeployment"}

// scaledOverlay takes the upgraded cluster down to one worker.
const scaledOverlay = `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../upgrade
patches:
  - target: {kind: MachineDeployment}
    patch: |
      - op: replace
        path: /spec/replicas
        value: 1
`

// The mgmt example, Ready on the real providers or the simulator, is upgraded from
// v1.35.4 to v1.36.1 by pointing its deployment at the upgrade overlay:
// KCP and the MachineDeployment replace every machine one by one on the
// same five hosts (maxSurge 0: no spare host), and the deployment is Ready
// again only with every machine at v1.36.1. A commit that takes the
// workers down to one then deletes a machine and BMO deprovisions its
// host, which becomes available again.
func TestCapm3UpgradeAndScale(t *testing.T) {
	onEachBackend(t, testCapm3UpgradeAndScale)
}

func testCapm3UpgradeAndScale(t *testing.T, b *backend) {
	c := newClient(t)
	ns := newNamespace(t, "capm3-upgrade")
	b.play(t, ns)
	dumpStatus(t, ns, kcpGVK, mdGVK, machineGVK, hostGVK)
	cd, files := mgmtExample(t, ns, map[string]string{
		"API_ENDPOINT":   "127.0.0.1",
		"API_PORT":       strconv.Itoa(freeLoopbackPort(t)),
		"BOOT_INTERFACE": "nic-1",
	})
	startDaemon(t, nil)
	if err := c.Create(context.Background(), cd); err != nil {
		t.Fatal(err)
	}
	before := waitDeployment(t, c, ns, cd.Name, walkTimeout, "Ready at v1.35.4", isReady)
	original := machines(t, c, ns)
	if len(original) != 5 {
		t.Fatalf("%d machines at v1.35.4, want 3 control-plane and 2 workers: %v", len(original), original)
	}

	live := getDeployment(t, c, ns, cd.Name)
	live.Spec.Path = "clusters/mgmt/upgrade"
	if err := c.Update(context.Background(), live); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	upgraded := waitDeployment(t, c, ns, cd.Name, walkTimeout, "Ready after the upgrade", func(cd *capstanv1.ClusterDeployment) bool {
		return isReady(cd) && cd.Status.ObservedGeneration > before.Status.ObservedGeneration
	})
	t.Logf("upgrade v1.35.4 -> v1.36.1 on the %s providers: Ready in %s (%s)", b.name, time.Since(begin).Round(time.Millisecond), stageDurations(upgraded))

	now := machines(t, c, ns)
	if len(now) != 5 {
		t.Errorf("%d machines after the upgrade, want 5: %v", len(now), now)
	}
	for name, version := range now {
		if version != "v1.36.1" {
			t.Errorf("Machine %s runs %s after the upgrade, want v1.36.1", name, version)
		}
		if _, old := original[name]; old {
			t.Errorf("Machine %s was not replaced by the upgrade", name)
		}
	}
	for _, k := range []struct {
		gvk  schema.GroupVersionKind
		name string
	}{{kcpGVK, "mgmt"}, {mdGVK, "mgmt-workers"}} {
		obj := get(t, c, k.gvk, ns, k.name)
		versions, _, _ := unstructured.NestedSlice(obj.Object, "status", "versions")
		if len(versions) != 1 || versions[0].(map[string]any)["version"] != "v1.36.1" {
			t.Errorf("%s %s status.versions = %v after the upgrade, want every machine at v1.36.1", k.gvk.Kind, k.name, versions)
		}
	}

	// Scale the workers down to one, by a commit.
	files["clusters/mgmt/scaled/kustomization.yaml"] = scaledOverlay
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, "one worker"); err != nil {
		t.Fatal(err)
	}
	live = getDeployment(t, c, ns, cd.Name)
	live.Spec.Path = "clusters/mgmt/scaled"
	if err := c.Update(context.Background(), live); err != nil {
		t.Fatal(err)
	}
	begin = time.Now()
	waitDeployment(t, c, ns, cd.Name, walkTimeout, "Ready with one worker", func(cd *capstanv1.ClusterDeployment) bool {
		return isReady(cd) && cd.Status.ObservedGeneration > upgraded.Status.ObservedGeneration
	})
	waitFor(t, stageTimeout, "four machines and a worker host available again", func() (bool, error) {
		m := machines(t, c, ns)
		free := availableHosts(t, c, ns)
		return len(m) == 4 && len(free) == 1 && slices.Contains([]string{"mgmt-worker-0", "mgmt-worker-1"}, free[0]),
			fmt.Errorf("machines %v, available hosts %v", m, free)
	})
	t.Logf("scale to one worker on the %s providers: Ready and the host deprovisioned in %s", b.name, time.Since(begin).Round(time.Millisecond))
}

// machines are the Machines of ns by name, with their Kubernetes version.
func machines(t *testing.T, c client.Client, ns string) map[string]string {
	t.Helper()
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(machineGVK.GroupVersion().WithKind("MachineList"))
	if err := c.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range list.Items {
		if m.GetDeletionTimestamp() != nil {
			continue
		}
		out[m.GetName()], _, _ = unstructured.NestedString(m.Object, "spec", "version")
	}
	return out
}

// availableHosts are the BareMetalHosts of ns that BMO reports available.
func availableHosts(t *testing.T, c client.Client, ns string) []string {
	t.Helper()
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(hostGVK.GroupVersion().WithKind("BareMetalHostList"))
	if err := c.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, h := range list.Items {
		if state, _, _ := unstructured.NestedString(h.Object, "status", "provisioning", "state"); state == "available" {
			out = append(out, h.GetName())
		}
	}
	return out
}

func get(t *testing.T, c client.Client, gvk schema.GroupVersionKind, ns, name string) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(gvk)
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, obj); err != nil {
		t.Fatal(err)
	}
	return obj
}
