package testenv

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/capstan-dev/capstan/internal/image"
)

// TestNodeRunsPods starts an env with a node, runs a Deployment whose pod
// reaches the API server as its ServiceAccount and is probed by the
// kubelet, replaces a deleted pod, and checks that Stop leaves no process,
// mount or cgroup behind.
func TestNodeRunsPods(t *testing.T) {
	if err := CheckNode(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	begin := time.Now()
	e, err := Start(ctx, Options{Node: true, Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane and node started in %s", time.Since(begin).Round(time.Millisecond))
	stopped := false
	defer func() {
		if !stopped {
			e.Stop()
		}
	}()
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	tar := filepath.Join(t.TempDir(), "podprobe.tar")
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	idx, err := image.Build(ctx, image.Options{
		Dir: root, Package: "./internal/testenv/testdata/podprobe", Binary: "podprobe",
		Platforms: []string{"linux/" + runtime.GOARCH},
	})
	if err != nil {
		t.Fatal(err)
	}
	const ref = "capstan.dev/testenv/podprobe:test"
	if err := image.WriteOCITarball(tar, idx, ref); err != nil {
		t.Fatal(err)
	}
	if err := e.ImportImage(ctx, tar); err != nil {
		t.Fatal(err)
	}

	ns, err := e.CreateNamespace(ctx, "node")
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, func() error {
		_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "probe"}}, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: "probe"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list"}}},
		}, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "probe"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "probe"},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "probe", Namespace: ns}},
		}, metav1.CreateOptions{})
		return err
	})
	port := freePort(t)
	host, apiPort := e.PodAPIServer()
	labels := map[string]string{"app": "probe"}
	probe := &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Host: "127.0.0.1", Path: "/healthz", Port: intstr.FromInt(port)}},
		PeriodSeconds: 1,
	}
	mustCreate(t, func() error {
		_, err := cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "probe"},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](1),
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{
						ServiceAccountName: "probe",
						HostNetwork:        true,
						Tolerations:        NodeTolerations,
						Containers: []corev1.Container{{
							Name: "probe", Image: ref, ImagePullPolicy: corev1.PullNever,
							Env: []corev1.EnvVar{
								{Name: "PORT", Value: strconv.Itoa(port)},
								{Name: "KUBERNETES_SERVICE_HOST", Value: host},
								{Name: "KUBERNETES_SERVICE_PORT", Value: strconv.Itoa(apiPort)},
							},
							ReadinessProbe: probe, LivenessProbe: probe,
						}},
					},
				},
			},
		}, metav1.CreateOptions{})
		return err
	})
	first := waitPodReady(t, cs, ns, "")
	t.Logf("pod %s Ready after %s", first.Name, time.Since(begin).Round(time.Millisecond))
	logs, err := e.PodLogs(ns, first.Name, "probe")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs, "list configmaps: 200 OK") {
		t.Errorf("the pod did not reach the API server as its ServiceAccount; its log:\n%s", logs)
	}
	if err := cs.CoreV1().Pods(ns).Delete(ctx, first.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	second := waitPodReady(t, cs, ns, first.Name)
	t.Logf("deleted pod %s replaced by %s, Ready", first.Name, second.Name)

	dir, cgroupRoot := e.Dir, e.node.cgroupRoot
	begin = time.Now()
	stopped = true
	if err := e.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	t.Logf("stopped in %s", time.Since(begin).Round(time.Millisecond))
	assertNothingLeft(t, dir, cgroupRoot)
}

// NodeTolerations let a pod run on the test node, which has no CNI and so
// stays NotReady.
var NodeTolerations = []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists}}

func assertNothingLeft(t *testing.T, dir, cgroupRoot string) {
	t.Helper()
	if mounts, _ := mountsUnder(dir); len(mounts) > 0 {
		t.Errorf("mounts left under %s: %v", dir, mounts)
	}
	entries, _ := os.ReadDir("/proc")
	for _, en := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", en.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte(dir)) {
			t.Errorf("process %s left: %s", en.Name(), bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
		}
	}
	for _, h := range cgroupHierarchies() {
		if _, err := os.Stat(filepath.Join(h, cgroupRoot)); err == nil {
			t.Errorf("cgroup %s left", filepath.Join(h, cgroupRoot))
		}
	}
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("directory %s left", dir)
	}
}

// waitPodReady waits for a Ready pod of the namespace other than notName.
func waitPodReady(t *testing.T, cs kubernetes.Interface, ns, notName string) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	last := ""
	for time.Now().Before(deadline) {
		pods, err := cs.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range pods.Items {
			if p.Name == notName || p.DeletionTimestamp != nil {
				continue
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					return &pods.Items[i]
				}
			}
			last = fmt.Sprintf("%s: %s %+v", p.Name, p.Status.Phase, p.Status.ContainerStatuses)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("no Ready pod in %s; last seen: %s", ns, last)
	return nil
}

func mustCreate(t *testing.T, create func() error) {
	t.Helper()
	if err := create(); err != nil {
		t.Fatal(err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
