package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/sources/dir"
)

// A local directory as the root source (`capstan run --dir`, `capstan dev
// --dir`): an edit to a file shows up in the cluster without a poll. The
// poll interval is an hour, so only the fsnotify watch can explain a
// reconcile.
func TestDirRootAppliesEditsWithoutPolling(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	root := t.TempDir()
	write := func(files map[string]string) { writeFiles(t, root, files) }
	files := rootCluster("gamma", ns)
	files["clusters/gamma/clusterdeployment.yaml"] = `apiVersion: capstan.dev/v1alpha1
kind: ClusterDeployment
metadata:
  name: gamma
spec:
  path: clusters/gamma/overlay
  interval: 1h
  substitute: {NS: ` + ns + `}
`
	write(files)
	src, err := dir.New(dir.Options{Path: root, Debounce: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	startDaemon(t, &reconciler.RootOptions{
		URL: "dir://" + src.Path(), Path: "clusters", Namespace: ns, Interval: time.Hour, Source: src,
	})
	first := waitDeployment(t, c, ns, "gamma", "Ready", isReady)

	edited := time.Now()
	write(map[string]string{"clusters/gamma/overlay/cm.yaml": `apiVersion: v1
kind: ConfigMap
metadata: {name: gamma-settings, namespace: "${NS}"}
data: {cluster: gamma, edited: "yes"}
`})
	waitDeployment(t, c, ns, "gamma", "Ready at a new revision", func(cd *capstanv1.ClusterDeployment) bool {
		return isReady(cd) && cd.Status.Revision != first.Status.Revision
	})
	t.Logf("file edit -> Ready at the new revision in %s", time.Since(edited).Round(time.Millisecond))
	cm := object(t, c, configMapGVK, ns, "gamma-settings")
	if got, _, _ := unstructured.NestedString(cm.Object, "data", "edited"); got != "yes" {
		t.Errorf("gamma-settings data.edited = %q after the edit, want yes", got)
	}
}

// writeFiles writes files (path relative to root -> content) under root,
// making their directories.
func writeFiles(t testing.TB, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
