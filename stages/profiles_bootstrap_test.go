package stages_test

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// bootstrapObjects is the capm3 fixture's cluster plus one object of
// every part the bootstrap profile finds by label, as
// examples/clusters/bootstrap commits them.
func bootstrapObjects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	component := func(v string) func(*unstructured.Unstructured) { return labelled("capstan.dev/component", v) }
	return append(loadObjects(t, capm3Fixture, "mgmt"),
		object("v1", "Namespace", "", "mgmt"),
		object("v1", "Namespace", "", "bootstrap-providers", component("provider")),
		object("apps/v1", "Deployment", "bootstrap-providers", "capi-controller-manager", component("provider")),
		object("v1", "ConfigMap", "bootstrap-providers", "capi-settings", component("provider")),
		object("v1", "Namespace", "", "capi-system", component("cluster-objects")),
		object("v1", "Secret", "iam", "iam-admin", component("cluster-objects")),
		object("v1", "ConfigMap", "capi-system", "capi-settings", component("provider-config")),
		object("apps/v1", "Deployment", "capi-system", "capi-controller-manager", component("helm-bundle")),
		object("apps/v1", "Deployment", "helm-system", "helm-controller", component("helm-controller")),
		object("v1", "ConfigMap", "helm-system", "helm-controller-config", component("helm-controller-config")),
		object("lcm.capstan.dev/v1alpha1", "LCMCluster", "mgmt", "mgmt"),
		object("lcm.capstan.dev/v1alpha1", "LCMMachine", "mgmt", "mgmt-cp-0"),
	)
}

// TestBootstrapPlanPlacesEveryObject: every object lands in the stage that
// builds it in seed 000's order.
func TestBootstrapPlanPlacesEveryObject(t *testing.T) {
	plan, err := stages.BuildPlan(mustProfile(t, "bootstrap").Stages, bootstrapObjects(t))
	if err != nil {
		t.Fatal(err)
	}
	var secrets []string
	for _, o := range hostsAndSecrets() {
		if strings.HasPrefix(o, "Secret/") {
			secrets = append(secrets, o)
		}
	}
	bootstrapProviders := []string{"Deployment/capi-controller-manager"} // in bootstrap-providers
	want := map[string][]string{
		"ProxySettingsHandled": {"Cluster/mgmt", "ConfigMap/capi-settings", "ConfigMap/capi-settings",
			"ConfigMap/helm-controller-config", "IPPool/mgmt-provisioning"},
		"ClusterSSHConfigured":               append([]string{"Namespace/mgmt"}, secrets...),
		"ProviderUpdatedInBootstrap":         {"ConfigMap/capi-settings", "Deployment/capi-controller-manager", "Namespace/bootstrap-providers"},
		"ProviderEnabledInBootstrap":         bootstrapProviders,
		"ObjectsCreated":                     {"Namespace/capi-system", "Secret/iam-admin"},
		"ProviderConfigured":                 {"ConfigMap/capi-settings"},
		"HelmBundleReady":                    {"Deployment/capi-controller-manager", "Deployment/helm-controller"},
		"ControllersDisabledBeforePivot":     bootstrapProviders,
		"PivotDone":                          {"Cluster/mgmt"},
		"ControllersEnabledAfterPivot":       {"Deployment/capi-controller-manager"}, // in capi-system
		"MachinesLCMAgentUpdated":            {"LCMCluster/mgmt", "LCMMachine/mgmt-cp-0"},
		"HelmControllerDisabledBeforeConfig": {"Deployment/helm-controller"},
		"HelmControllerConfigUpdated":        {"ConfigMap/helm-controller-config"},
		"HelmControllerEnabledAfterConfig":   {"Deployment/helm-controller"},
		"ClusterReady":                       {"Cluster/mgmt", "Deployment/capi-controller-manager", "Deployment/helm-controller"},
	}
	for _, o := range hostsAndSecrets() {
		if strings.HasPrefix(o, "BareMetalHost/") {
			want["NodesReady"] = append(want["NodesReady"], o)
		}
	}
	want["NodesReady"] = append(want["NodesReady"], "Cluster/mgmt", "IPPool/mgmt-provisioning", "KubeadmConfigTemplate/mgmt-workers",
		"KubeadmControlPlane/mgmt", "LCMCluster/mgmt", "LCMMachine/mgmt-cp-0", "MachineDeployment/mgmt-workers", "Metal3Cluster/mgmt",
		"Metal3DataTemplate/mgmt-nodes", "Metal3MachineTemplate/mgmt-controlplane", "Metal3MachineTemplate/mgmt-workers")
	for _, v := range want {
		sort.Strings(v)
	}
	comparePlans(t, plannedObjects(plan), want)

	// The namespaces say which Deployment is which: the bootstrap's
	// providers are scaled before the pivot, the new cluster's after it,
	// and ClusterReady does not wait for the bootstrap's.
	for stage, ns := range map[string]string{
		"ProviderEnabledInBootstrap": "bootstrap-providers", "ControllersDisabledBeforePivot": "bootstrap-providers",
		"ControllersEnabledAfterPivot": "capi-system",
	} {
		for _, o := range stageOf(t, plan, stage).Objects {
			if o.GetNamespace() != ns {
				t.Errorf("stage %s scales %s, want only the Deployments of %s", stage, stages.ObjectRef(o), ns)
			}
		}
	}
	for _, o := range stageOf(t, plan, "ClusterReady").Objects {
		if o.GetNamespace() == "bootstrap-providers" {
			t.Errorf("ClusterReady waits for %s, a Deployment of the bootstrap cluster", stages.ObjectRef(o))
		}
	}
}

// TestBootstrapProfileClusters pins the cluster each stage acts on:
// before the pivot the bootstrap cluster, or the new one through the
// kubeconfig Cluster API writes for the deployment's Cluster; the pivot
// moves into that one (its default); after it, the Capstan of the new
// cluster acts on its own cluster.
func TestBootstrapProfileClusters(t *testing.T) {
	const (
		bootstrap = "bootstrap"
		viaSecret = "new cluster through <cluster>-kubeconfig"
		moves     = "moves into the new cluster"
		own       = "new cluster, by its own Capstan"
	)
	want := []struct{ stage, where string }{
		{"ProxySettingsHandled", bootstrap},
		{"ClusterSSHConfigured", bootstrap},
		{"ProviderUpdatedInBootstrap", bootstrap},
		{"ProviderEnabledInBootstrap", bootstrap},
		{"NodesReady", bootstrap},
		{"ObjectsCreated", viaSecret},
		{"ProviderConfigured", viaSecret},
		{"HelmBundleReady", viaSecret},
		{"ControllersDisabledBeforePivot", bootstrap},
		{"PivotDone", moves},
		{"ControllersEnabledAfterPivot", own},
		{"MachinesLCMAgentUpdated", own},
		{"HelmControllerDisabledBeforeConfig", own},
		{"HelmControllerConfigUpdated", own},
		{"HelmControllerEnabledAfterConfig", own},
		{"ClusterReady", own},
	}
	p := mustProfile(t, "bootstrap")
	if len(p.Stages) != len(want) {
		t.Fatalf("profile bootstrap has %d stages, want %d", len(p.Stages), len(want))
	}
	pivoted := false
	for i, s := range p.Stages {
		var where string
		switch {
		case s.Action == capstanv1.StageActionPivot && s.KubeConfig == nil:
			where, pivoted = moves, true
		case s.KubeConfig != nil && s.KubeConfig.Cluster != nil && s.KubeConfig.Cluster.Name == "" && s.KubeConfig.SecretRef == nil && !pivoted:
			where = viaSecret
		case s.KubeConfig == nil && pivoted:
			where = own
		case s.KubeConfig == nil:
			where = bootstrap
		default:
			where = fmt.Sprintf("kubeConfig %+v", *s.KubeConfig)
		}
		if s.Name != want[i].stage || where != want[i].where {
			t.Errorf("stage %d: %s acts on %s; want %s on %s", i+1, s.Name, where, want[i].stage, want[i].where)
		}
	}
}

// TestBootstrapStagesAfterThePivotFindTheirObjects: a stage after the
// pivot runs in the new cluster, where only these exist: what the move
// copied (custom resources, Secrets and ConfigMaps the bootstrap cluster
// got), what stages 6-8 applied there, and what stages after the pivot
// apply. A Deployment or Namespace applied into the bootstrap cluster is
// not there.
func TestBootstrapStagesAfterThePivotFindTheirObjects(t *testing.T) {
	p := mustProfile(t, "bootstrap")
	plan, err := stages.BuildPlan(p.Stages, bootstrapObjects(t))
	if err != nil {
		t.Fatal(err)
	}
	pivot := slices.IndexFunc(plan.Stages, func(s stages.Stage) bool { return s.Action == capstanv1.StageActionPivot })
	owner := map[*unstructured.Unstructured]int{}
	for i, s := range plan.Stages {
		if s.Action != capstanv1.StageActionApply {
			continue
		}
		for _, o := range s.Objects {
			if _, ok := owner[o]; !ok {
				owner[o] = i
			}
		}
	}
	for i := pivot + 1; i < len(plan.Stages); i++ {
		s := plan.Stages[i]
		for _, o := range s.Objects {
			j, ok := owner[o]
			switch {
			case !ok:
				t.Errorf("stage %s acts on %s, which no stage applies", s.Name, stages.ObjectRef(o))
			case j > pivot, plan.Stages[j].KubeConfig != nil:
				// Applied in the new cluster.
			case !moves(o):
				t.Errorf("stage %s (after the pivot) acts on %s, which stage %s applies into the bootstrap cluster and the move leaves there",
					s.Name, stages.ObjectRef(o), plan.Stages[j].Name)
			}
		}
	}
}

// moves reports whether a pivot moves objects of o's kind: Secrets,
// ConfigMaps and custom resources (docs/pivot.md).
func moves(o *unstructured.Unstructured) bool {
	gvk := o.GroupVersionKind()
	switch gvk.Group {
	case "":
		return gvk.Kind == "Secret" || gvk.Kind == "ConfigMap"
	case "apps", "batch", "policy", "rbac.authorization.k8s.io", "networking.k8s.io", "apiextensions.k8s.io", "coordination.k8s.io":
		return false
	}
	return true
}

func stageOf(t *testing.T, plan *stages.Plan, name string) stages.Stage {
	t.Helper()
	for _, s := range plan.Stages {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no stage %s", name)
	return stages.Stage{}
}
