package main

import (
	"context"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand"
	"time"

	pkgerrors "github.com/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	cloudv1 "sigs.k8s.io/cluster-api/test/infrastructure/inmemory/pkg/cloud/api/v1alpha1"
	inmemoryruntime "sigs.k8s.io/cluster-api/test/infrastructure/inmemory/pkg/runtime"
	"sigs.k8s.io/cluster-api/util/certs"
	"sigs.k8s.io/cluster-api/util/secret"
)

func (r *machineReconciler) ensureNode(ctx context.Context, c inmemoryruntime.Client, machine *clusterv1.Machine, t nodeTarget, cp bool) error {
	node := &corev1.Node{}
	err := c.Get(ctx, client.ObjectKey{Name: t.name}, node)
	if err == nil {
		// Keep providerID in sync if the Machine ended up with another one
		// (e.g. CAPM3 legacy metal3://<uuid>); the Machine controller matches
		// Node.spec.providerID == Machine.spec.providerID exactly.
		if machine.Spec.ProviderID != "" && node.Spec.ProviderID != machine.Spec.ProviderID {
			node.Spec.ProviderID = machine.Spec.ProviderID
			return c.Update(ctx, node)
		}
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return pkgerrors.Wrap(err, "failed to get node")
	}
	now := metav1.Now()
	labels := map[string]string{
		"kubernetes.io/hostname": t.name, // CAPM3 SetNodeProviderIDByHostname matches this
		"kubernetes.io/os":       "linux",
	}
	for k, v := range t.labels {
		labels[k] = v
	}
	node = &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: t.name, Labels: labels},
		Spec:       corev1.NodeSpec{ProviderID: t.providerID},
		Status: corev1.NodeStatus{
			NodeInfo: corev1.NodeSystemInfo{KubeletVersion: machine.Spec.Version},
			Conditions: []corev1.NodeCondition{
				{LastTransitionTime: now, Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"},
				{LastTransitionTime: now, Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory"},
				{LastTransitionTime: now, Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure"},
				{LastTransitionTime: now, Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID"},
			},
		},
	}
	if cp {
		// KCP: NodeKubeadmLabelsAndTaintsSet needs the label and, unless the
		// KubeadmConfig sets other taints, the NoSchedule taint.
		node.Labels[controlPlaneRole] = ""
		node.Spec.Taints = []corev1.Taint{{Key: controlPlaneRole, Effect: corev1.TaintEffectNoSchedule}}
	}
	if err := c.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
		return pkgerrors.Wrap(err, "failed to create Node")
	}
	return nil
}

// staticPod is a Running+Ready kubeadm static pod as KCP reads it
// (name <component>-<node>, labels component/tier, PodReady=True).
func staticPod(component, nodeName string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: metav1.NamespaceSystem,
			Name:      fmt.Sprintf("%s-%s", component, nodeName),
			Labels:    map[string]string{"component": component, "tier": "control-plane"},
			// Not in CAPD: real static pods are mirror pods, and with this
			// annotation the Machine controller's drain skips them
			// (core/reconcilers/machine/drain/filters.go mirrorPodFilter)
			// instead of POSTing pods/eviction, which the fake server has no
			// route for (that 404 is read as "already gone", so it works either way).
			Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "capstan"},
		},
		Spec: corev1.PodSpec{NodeName: nodeName},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
}

func createIfMissing(ctx context.Context, c inmemoryruntime.Client, obj client.Object) error {
	if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		return pkgerrors.Wrapf(err, "failed to create %s", obj.GetName())
	}
	return nil
}

// ensureEtcd mirrors reconcileNormalETCD: an etcd-<node> pod annotated with
// cluster ID, member ID and (first member) leader-from; then a serving
// certificate for that member signed by the <cluster>-etcd CA.
func (r *machineReconciler) ensureEtcd(ctx context.Context, c inmemoryruntime.Client, cluster *clusterv1.Cluster, listenerName, nodeName string) error {
	pod := staticPod("etcd", nodeName)
	etcdMember := pod.Name
	if err := c.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{}); err != nil {
		if !apierrors.IsNotFound(err) {
			return pkgerrors.Wrap(err, "failed to get etcd Pod")
		}
		info, err := getEtcdInfo(ctx, c)
		if err != nil {
			return err
		}
		if info.clusterID == "" {
			for info.clusterID == "" || info.clusterID == "0" {
				info.clusterID = fmt.Sprintf("%d", rand.Uint32())
			}
		}
		var memberID string
		for memberID == "" || memberID == "0" || info.members.Has(memberID) {
			memberID = fmt.Sprintf("%d", rand.Uint32())
		}
		pod.Annotations[cloudv1.EtcdClusterIDAnnotationName] = info.clusterID
		pod.Annotations[cloudv1.EtcdMemberIDAnnotationName] = memberID
		if info.leaderID == "" {
			// First member (or, not in CAPD, a cluster left without a leader).
			pod.Annotations[cloudv1.EtcdLeaderFromAnnotationName] = time.Now().Format(time.RFC3339)
		}
		if err := createIfMissing(ctx, c, pod); err != nil {
			return err
		}
	}
	if r.clusters.mux.HasEtcdMember(listenerName, etcdMember) {
		return nil
	}
	cert, key, err := loadCA(ctx, r.clusters.APIReader, cluster, secret.EtcdCA)
	if err != nil {
		return err
	}
	// AddEtcdMember(wclName, podName string, caCert *x509.Certificate, caKey *rsa.PrivateKey) error
	return pkgerrors.Wrap(r.clusters.mux.AddEtcdMember(listenerName, etcdMember, cert, key), "failed to start etcd member")
}

type etcdInfo struct {
	clusterID string
	leaderID  string
	members   sets.Set[string]
}

// getEtcdInfo is CAPD's, except that "members but no leader" is not an error.
func getEtcdInfo(ctx context.Context, c inmemoryruntime.Client) (etcdInfo, error) {
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods, client.InNamespace(metav1.NamespaceSystem),
		client.MatchingLabels{"component": "etcd", "tier": "control-plane"}); err != nil {
		return etcdInfo{}, pkgerrors.Wrap(err, "failed to list etcd members")
	}
	info := etcdInfo{members: sets.New[string]()}
	var leaderFrom time.Time
	for _, pod := range pods.Items {
		if _, removed := pod.Annotations[cloudv1.EtcdMemberRemoved]; removed {
			continue
		}
		if info.clusterID == "" {
			info.clusterID = pod.Annotations[cloudv1.EtcdClusterIDAnnotationName]
		} else if pod.Annotations[cloudv1.EtcdClusterIDAnnotationName] != info.clusterID {
			return etcdInfo{}, errors.New("invalid etcd cluster, members have different cluster ID")
		}
		memberID := pod.Annotations[cloudv1.EtcdMemberIDAnnotationName]
		info.members.Insert(memberID)
		if t, err := time.Parse(time.RFC3339, pod.Annotations[cloudv1.EtcdLeaderFromAnnotationName]); err == nil && t.After(leaderFrom) {
			info.leaderID, leaderFrom = memberID, t
		}
	}
	return info, nil
}

// ensureAPIServer mirrors reconcileNormalAPIServer. The first AddAPIServer of
// a listener creates the serving cert (CN kube-apiserver, SANs localhost,
// 127.0.0.1, ::1, host) from the <cluster>-ca CA, binds ":<port>" and waits
// until a TLS dial succeeds.
func (r *machineReconciler) ensureAPIServer(ctx context.Context, c inmemoryruntime.Client, cluster *clusterv1.Cluster, listenerName, nodeName string) error {
	pod := staticPod("kube-apiserver", nodeName)
	if err := createIfMissing(ctx, c, pod); err != nil {
		return err
	}
	if r.clusters.mux.HasAPIServer(listenerName, pod.Name) {
		return nil
	}
	cert, key, err := loadCA(ctx, r.clusters.APIReader, cluster, secret.ClusterCA)
	if err != nil {
		return err
	}
	// AddAPIServer(wclName, podName string, caCert *x509.Certificate, caKey *rsa.PrivateKey) error
	return pkgerrors.Wrap(r.clusters.mux.AddAPIServer(listenerName, pod.Name, cert, key), "failed to start API server")
}

// ensureKubeadmObjects mirrors reconcileNormalKubeadmObjects. kubeadm-config
// is what KCP checks for "initialized" (HasKubeadmConfig). CAPD's
// "ClusterConfiguration": "" decodes as an empty config (json serializer
// defaults the kind from the target type), so UpdateClusterConfiguration
// works during upgrades. kube-proxy and CoreDNS are deliberately not created:
// KCP skips both when they are NotFound (workload_cluster.go
// UpdateKubeProxyImageInfo, workload_cluster_coredns.go UpdateCoreDNS).
func ensureKubeadmObjects(ctx context.Context, c inmemoryruntime.Client) error {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "kubeadm:get-nodes"},
		Rules:      []rbacv1.PolicyRule{{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"nodes"}}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kubeadm:get-nodes"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "kubeadm:get-nodes"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, Name: "system:bootstrappers:kubeadm:default-node-token"}},
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "kubeadm-config", Namespace: metav1.NamespaceSystem},
		Data:       map[string]string{"ClusterConfiguration": ""},
	}
	for _, obj := range []client.Object{role, binding, cm} {
		if err := createIfMissing(ctx, c, obj); err != nil {
			return err
		}
	}
	return nil
}

// loadCA reads <cluster>-ca or <cluster>-etcd (written by KCP) from the
// management cluster. The mux wants an RSA key (KCP's default
// encryptionAlgorithm RSA-2048); ECDSA CAs are not supported by the library.
func loadCA(ctx context.Context, reader client.Reader, cluster *clusterv1.Cluster, purpose secret.Purpose) (*x509.Certificate, *rsa.PrivateKey, error) {
	s, err := secret.Get(ctx, reader, client.ObjectKeyFromObject(cluster), purpose)
	if err != nil {
		return nil, nil, pkgerrors.Wrapf(err, "failed to get %s CA", purpose)
	}
	cert, err := certs.DecodeCertPEM(s.Data[secret.TLSCrtDataName])
	if err != nil || cert == nil {
		return nil, nil, pkgerrors.Errorf("invalid %s CA: bad %s", purpose, secret.TLSCrtDataName)
	}
	key, err := certs.DecodePrivateKeyPEM(s.Data[secret.TLSKeyDataName]) // crypto.Signer
	if err != nil {
		return nil, nil, pkgerrors.Wrapf(err, "invalid %s CA: bad %s", purpose, secret.TLSKeyDataName)
	}
	rsaKey, ok := key.(*rsa.PrivateKey)
	if !ok {
		return nil, nil, pkgerrors.Errorf("%s CA key is %T; the in-memory mux needs *rsa.PrivateKey", purpose, key)
	}
	return cert, rsaKey, nil
}

// cleanup mirrors ReconcileDelete of the in-memory machine backend:
// Node, etcd pod + mux member, API server pod + mux API server (the listener
// stops when the last one goes), scheduler and controller-manager pods.
