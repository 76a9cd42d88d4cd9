package manifests

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"path"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/kustomize/kyaml/resid"
	"sigs.k8s.io/yaml"
)

// Namespace is where Capstan is installed unless told otherwise.
const Namespace = "capstan-system"

// ImageName is the image name the Deployment refers to; kustomization.yaml's
// images entry of that name says which image it really is.
const ImageName = "capstan"

// Options say how to install Capstan; the zero value installs what
// kustomization.yaml says.
type Options struct {
	// Image is the daemon's image reference; empty means the image
	// kustomization.yaml names (set at release time).
	Image string
	// Namespace is where the daemon, its ServiceAccount and its Lease live;
	// empty means capstan-system.
	Namespace string
	// Source is the root source; a zero Source runs without one.
	Source Source
	// Replicas of the Deployment; 0 means 1. More than one stand by on the
	// leader-election Lease.
	Replicas int32
	// HostNetwork runs the daemon in the node's network namespace, which a
	// cluster without a CNI yet needs (a freshly built cluster before its
	// network add-on, or a test node). It also tolerates the not-ready
	// taint such a node carries.
	HostNetwork bool
	// APIServer, "host:port", is how the pods reach the API server when the
	// kubernetes Service does not work (no kube-proxy yet).
	APIServer string
	// MetricsPort and HealthPort are the container ports; 0 means 8080 and
	// 8081. With HostNetwork they are ports of the node.
	MetricsPort, HealthPort int
	// Tenancy adds components/tenancy: the multi-tenant install, in which
	// every deployment acts as a ServiceAccount of its own namespace
	// (capstan-deployer unless it names another) and Capstan reads
	// Secrets and impersonates only in the namespaces bound to it
	// (docs/tenancy.md#multi-tenant-install).
	Tenancy bool
	// Patches are kustomize patches applied last: strategic-merge patches
	// that name their object, or JSON 6902 patches with a target.
	Patches []types.Patch
}

// TenancyComponent is the kustomize component of the multi-tenant install,
// relative to the manifests' root.
const TenancyComponent = "components/tenancy"

// DefaultTenantServiceAccount is the ServiceAccount a deployment acts as in
// the multi-tenant install when it names none: capstan-deployer of its own
// namespace.
const DefaultTenantServiceAccount = "capstan-deployer"

// Source is the root source the daemon follows.
type Source struct {
	URL, Branch, Path, Username string
	// Interval is how often the source is polled, e.g. "1m"; empty keeps
	// the default. A push webhook makes a long interval cheap.
	Interval string
}

// Objects renders the install manifests with opts: CRDs, Namespace, RBAC,
// the source ConfigMap, the Deployment and its Service, in the order
// kustomize gives (namespaces and CRDs first).
func Objects(opts Options) ([]*unstructured.Unstructured, error) {
	k, err := kustomization(opts)
	if err != nil {
		return nil, err
	}
	fsys := filesys.MakeFsInMemory()
	err = fs.WalkDir(Kustomization, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(Kustomization, p)
		if err != nil {
			return err
		}
		if p == "kustomization.yaml" {
			data = k
		}
		return fsys.WriteFile(path.Join("/", p), data)
	})
	if err != nil {
		return nil, fmt.Errorf("render install manifests: %w", err)
	}
	m, err := krusty.MakeKustomizer(&krusty.Options{
		LoadRestrictions: types.LoadRestrictionsRootOnly,
		PluginConfig:     types.DisabledPluginConfig(),
	}).Run(fsys, "/")
	if err != nil {
		return nil, fmt.Errorf("render install manifests: %w", err)
	}
	objs := make([]*unstructured.Unstructured, 0, m.Size())
	for _, r := range m.Resources() {
		// Through JSON, so numbers are int64 as the client libraries expect.
		data, err := r.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("render install manifests: %s: %w", r.CurId(), err)
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(data); err != nil {
			return nil, fmt.Errorf("render install manifests: %s: %w", r.CurId(), err)
		}
		objs = append(objs, obj)
	}
	if err := patchesMatch(opts.Patches, objs); err != nil {
		return nil, err
	}
	if err := setImageEnv(objs); err != nil {
		return nil, err
	}
	return objs, nil
}

// ImageEnv tells the daemon which image it runs, so that a pivot can
// install the same image into the cluster it moved a deployment into.
const ImageEnv = "CAPSTAN_IMAGE"

// setImageEnv sets ImageEnv on the daemon's container to its image, as
// kustomize resolved it.
func setImageEnv(objs []*unstructured.Unstructured) error {
	d := find(objs, "Deployment")
	if d == nil {
		return nil
	}
	containers, _, err := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	if err != nil {
		return fmt.Errorf("render install manifests: Deployment %s containers: %w", d.GetName(), err)
	}
	for i, c := range containers {
		m, ok := c.(map[string]any)
		if !ok || m["name"] != "capstan" {
			continue
		}
		env, _ := m["env"].([]any)
		kept := env[:0]
		for _, e := range env {
			if em, ok := e.(map[string]any); !ok || em["name"] != ImageEnv {
				kept = append(kept, e)
			}
		}
		m["env"] = append(kept, map[string]any{"name": ImageEnv, "value": m["image"]})
		containers[i] = m
	}
	return unstructured.SetNestedSlice(d.Object, containers, "spec", "template", "spec", "containers")
}

// patchesMatch reports the patches that name an object the manifests do not
// have: kustomize skips a patch whose target matches nothing, and a typo
// must not go unnoticed.
func patchesMatch(patches []types.Patch, objs []*unstructured.Unstructured) error {
	var errs []error
	for i, p := range patches {
		p, err := targeted(p)
		if err != nil || p.Target == nil || p.Target.Kind == "" || p.Target.Name == "" {
			continue
		}
		found := false
		for _, o := range objs {
			found = found || (o.GetKind() == p.Target.Kind && o.GetName() == p.Target.Name)
		}
		if !found {
			errs = append(errs, fmt.Errorf("patch %d: the install manifests have no %s %q", i+1, p.Target.Kind, p.Target.Name))
		}
	}
	return errors.Join(errs...)
}

// kustomization returns kustomization.yaml with opts applied.
func kustomization(opts Options) ([]byte, error) {
	data, err := fs.ReadFile(Kustomization, "kustomization.yaml")
	if err != nil {
		return nil, err
	}
	var k types.Kustomization
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		return nil, fmt.Errorf("read embedded kustomization.yaml: %w", err)
	}
	var errs []error
	if opts.Image != "" {
		img, err := parseImage(opts.Image)
		if err != nil {
			errs = append(errs, err)
		}
		for i := range k.Images {
			if k.Images[i].Name == ImageName {
				k.Images[i] = img
			}
		}
	}
	if opts.Namespace != "" {
		k.Namespace = opts.Namespace
		// The Namespace object is named in namespace.yaml, which the
		// namespace transformer leaves alone.
		k.Patches = append(k.Patches, jsonPatch("Namespace", "", "replace", "/metadata/name", opts.Namespace))
	}
	for i := range k.ConfigMapGenerator {
		if k.ConfigMapGenerator[i].Name == "capstan-source" {
			k.ConfigMapGenerator[i].LiteralSources = sourceLiterals(k.ConfigMapGenerator[i].LiteralSources, opts.Source)
		}
	}
	if opts.Source.Interval != "" {
		if d, err := time.ParseDuration(opts.Source.Interval); err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("source interval %q: want a positive duration such as 1m", opts.Source.Interval))
		}
	}
	if opts.Tenancy {
		k.Components = append(k.Components, TenancyComponent)
	}
	if opts.Replicas > 0 {
		k.Replicas = append(k.Replicas, types.Replica{Name: "capstan", Count: int64(opts.Replicas)})
	}
	ports, err := portPatches(opts)
	errs = append(errs, err)
	k.Patches = append(k.Patches, ports...)
	if opts.HostNetwork {
		k.Patches = append(k.Patches, deploymentPatch(hostNetworkPatch))
	}
	if opts.APIServer != "" {
		p, err := apiServerPatch(opts.APIServer)
		errs = append(errs, err)
		k.Patches = append(k.Patches, p)
	}
	for _, p := range opts.Patches {
		p, err := targeted(p)
		errs = append(errs, err)
		k.Patches = append(k.Patches, p)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return yaml.Marshal(k)
}

// parseImage turns "repo[:tag][@digest]" into an images entry for the
// Deployment's image.
func parseImage(ref string) (types.Image, error) {
	img := types.Image{Name: ImageName}
	name := ref
	if i := strings.Index(name, "@"); i >= 0 {
		name, img.Digest = name[:i], name[i+1:]
		if !strings.Contains(img.Digest, ":") {
			return img, fmt.Errorf("image %q: digest %q: want algorithm:hex", ref, img.Digest)
		}
	}
	// A colon after the last slash starts the tag; one before it is a
	// registry port.
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name, img.NewTag = name[:i], name[i+1:]
	}
	if name == "" || strings.ContainsAny(name, " \t\n") {
		return img, fmt.Errorf("image %q: want REPOSITORY[:TAG][@DIGEST]", ref)
	}
	img.NewName = name
	if img.NewTag == "" && img.Digest == "" {
		img.NewTag = "latest"
	}
	return img, nil
}

func sourceLiterals(literals []string, src Source) []string {
	set := map[string]string{
		"CAPSTAN_SOURCE":          src.URL,
		"CAPSTAN_BRANCH":          src.Branch,
		"CAPSTAN_PATH":            src.Path,
		"CAPSTAN_SOURCE_USERNAME": src.Username,
		"CAPSTAN_INTERVAL":        src.Interval,
	}
	out := make([]string, 0, len(literals))
	for _, l := range literals {
		key, _, _ := strings.Cut(l, "=")
		if v := set[key]; v != "" {
			l = key + "=" + v
		}
		out = append(out, l)
	}
	return out
}

// hostNetworkPatch runs the daemon in the node's network. Such a node has no
// CNI yet, so it is NotReady and tainted; the daemon is what finishes the
// cluster, so it tolerates that. Two pods on one node cannot share the
// ports, so a new pod replaces the old one instead of surging beside it.
const hostNetworkPatch = `apiVersion: apps/v1
kind: Deployment
metadata: {name: capstan}
spec:
  strategy: {type: Recreate, rollingUpdate: null}
  template:
    spec:
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      tolerations:
        - {key: node.kubernetes.io/not-ready, operator: Exists}
        - {key: node.kubernetes.io/network-unavailable, operator: Exists}
`

// apiServerPatch points the in-cluster config at hostPort, which must then
// be covered by the API server's serving certificate.
func apiServerPatch(hostPort string) (types.Patch, error) {
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil || host == "" {
		return types.Patch{}, fmt.Errorf("API server address %q: want host:port", hostPort)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return types.Patch{}, fmt.Errorf("API server address %q: port %q is not a port number", hostPort, port)
	}
	return deploymentPatch(fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: capstan}
spec:
  template:
    spec:
      containers:
        - name: capstan
          env:
            - {name: KUBERNETES_SERVICE_HOST, value: %q}
            - {name: KUBERNETES_SERVICE_PORT, value: %q}
`, host, port)), nil
}

// portPatches move the metrics and health ports, the arguments that bind
// them and the Service's target.
func portPatches(opts Options) ([]types.Patch, error) {
	var out []types.Patch
	for _, p := range []struct {
		port, index int
		flag, name  string
	}{
		{opts.MetricsPort, 0, "--metrics-addr", "metrics"},
		{opts.HealthPort, 1, "--health-addr", "health"},
	} {
		if p.port == 0 {
			continue
		}
		if p.port < 1 || p.port > 65535 {
			return nil, fmt.Errorf("%s port %d: want 1-65535", p.name, p.port)
		}
		out = append(out,
			jsonPatch("Deployment", "capstan", "replace",
				fmt.Sprintf("/spec/template/spec/containers/0/ports/%d/containerPort", p.index), p.port),
			jsonPatch("Deployment", "capstan", "add",
				"/spec/template/spec/containers/0/args/-", fmt.Sprintf("%s=:%d", p.flag, p.port)))
	}
	return out, nil
}

// deploymentPatch is a strategic-merge patch of the Deployment, whatever
// namespace it ends up in.
func deploymentPatch(patch string) types.Patch {
	return types.Patch{Patch: patch, Target: &types.Selector{ResId: resID("Deployment", "capstan")}}
}

// targeted gives a strategic-merge patch without a target the kind and name
// it names as its target, so that it matches in any namespace: the
// manifests name capstan-system, which Options.Namespace may change.
func targeted(p types.Patch) (types.Patch, error) {
	if p.Target != nil || p.Path != "" {
		return p, nil
	}
	var head struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal([]byte(p.Patch), &head); err != nil {
		return p, fmt.Errorf("patch: %w", err)
	}
	if head.Kind == "" || head.Metadata.Name == "" {
		return p, errors.New("patch: a strategic-merge patch names its object's kind and metadata.name; a JSON 6902 patch needs a target")
	}
	p.Target = &types.Selector{ResId: resID(head.Kind, head.Metadata.Name)}
	return p, nil
}

// jsonPatch is one JSON 6902 operation on the objects of kind (and name).
func jsonPatch(kind, name, op, path string, value any) types.Patch {
	v, _ := yaml.Marshal(value)
	return types.Patch{
		Target: &types.Selector{ResId: resID(kind, name)},
		Patch:  fmt.Sprintf("- op: %s\n  path: %s\n  value: %s", op, path, strings.TrimSpace(string(v))),
	}
}

func resID(kind, name string) resid.ResId {
	return resid.ResId{Gvk: resid.Gvk{Kind: kind}, Name: name}
}
