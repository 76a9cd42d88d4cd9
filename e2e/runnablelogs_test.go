package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/sources/dir"
	"github.com/capstan-dev/capstan/sources/git"
)

// waitLogs waits until logs holds every line of want (a message each).
func waitLogs(t *testing.T, logs *logBuffer, want ...string) {
	t.Helper()
	waitFor(t, "the daemon's logger to see "+strings.Join(want, ", "), func() (bool, error) {
		got := logs.String()
		var missing []string
		for _, w := range want {
			if !strings.Contains(got, w) {
				missing = append(missing, fmt.Sprintf("%q", w))
			}
		}
		if len(missing) > 0 {
			return false, fmt.Errorf("none yet of %s", strings.Join(missing, ", "))
		}
		return true, nil
	})
}

// Whatever the daemon runs beside its controller logs to Options.Logger:
// controller-runtime starts those runnables with a context of its own, in
// which log.FromContext would be the process-wide logger. One daemon
// with a git root source, status commits, sharding and the webhook
// receiver, then one with a directory root source (watched, not polled),
// each with its own logger: every runnable's line is in it.
func TestDaemonRunnablesLogToTheDaemonsLogger(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)

	t.Run("git root, status commits, sharding, webhook, leader", func(t *testing.T) {
		rootURL, err := gitSrv.CreateRepo(ns)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, rootCluster("alpha", ns), "add alpha"); err != nil {
			t.Fatal(err)
		}
		appURL, err := gitSrv.CreateRepo(ns + "-app")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := gitSrv.Commit(ns+"-app", gitserver.DefaultBranch, twoStageFiles("1"), "v1"); err != nil {
			t.Fatal(err)
		}
		logs := &logBuffer{}
		d, _ := startDaemonWith(t, &reconciler.RootOptions{
			URL: rootURL, Branch: "main", Path: "clusters", Namespace: ns, Interval: 500 * time.Millisecond,
			Auth: git.Auth{Username: "capstan", Password: "s3cret-token"},
		}, func(o *reconciler.Options) {
			o.Logger = logs.logger()
			o.Report = reconciler.ReportOptions{StatusBranch: statusBranch, Interval: time.Second}
			o.Sharding = reconciler.ShardingOptions{Enabled: true, Namespace: ns, Group: "e2e-logs", Identity: "replica-logs",
				LeaseDuration: 3 * time.Second, RenewPeriod: 500 * time.Millisecond}
			o.Webhook = &reconciler.WebhookOptions{Addr: "127.0.0.1:0", GitHubSecret: []byte(hookSecret)}
		})
		waitFor(t, "the replica to see itself", func() (bool, error) {
			return slices.Equal(d.ShardMembers(), []string{"replica-logs"}), nil
		})
		spec := twoStageSpec(appURL, ns, gitSecret(t, c, ns))
		spec.Interval = &metav1.Duration{Duration: time.Hour}
		createDeployment(t, c, ns, "hooked", spec)
		waitDeployment(t, c, ns, "alpha", "Ready", isReady)
		push := []byte(`{"ref": "refs/heads/main", "after": "0000000000000000000000000000000000000001", "repository": {"clone_url": "` + appURL + `"}}`)
		if code := githubPush(t, d.WebhookURL()+"github", hookSecret, push); code/100 != 2 {
			t.Fatalf("signed push: HTTP %d, want 2xx", code)
		}
		waitLogs(t, logs,
			"leading: this replica acts now", // the leader's line
			"root source synced",             // the root source
			"sharding: joining the group",    // sharding
			"push received, reconciling now", // the webhook receiver
			"status committed",               // status commits
		)
	})

	t.Run("directory root, watched", func(t *testing.T) {
		root := t.TempDir()
		write := func(files map[string]string) { writeFiles(t, root, files) }
		write(rootCluster("gamma", ns))
		src, err := dir.New(dir.Options{Path: root, Debounce: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		logs := &logBuffer{}
		startDaemonWith(t, &reconciler.RootOptions{
			URL: "dir://" + src.Path(), Path: "clusters", Namespace: ns, Interval: time.Hour, Source: src,
		}, func(o *reconciler.Options) { o.Logger = logs.logger() })
		waitDeployment(t, c, ns, "gamma", "Ready", isReady)
		write(map[string]string{"clusters/gamma/overlay/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: gamma-settings, namespace: \"${NS}\"}\ndata: {edited: \"yes\"}\n"})
		waitLogs(t, logs,
			"root source synced",                   // the root source
			"root source changed, reconciling now", // the source watcher
		)
	})
}
