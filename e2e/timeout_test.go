package e2e

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
)

// A stage never gives up by default; with a hard timeout the deployment
// stalls once the stage has waited longer, and says so. Nothing of a later
// stage is applied.
func TestHardTimeoutStallsTheDeployment(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, twoStageFiles("1"), "two stages"); err != nil {
		t.Fatal(err)
	}
	startDaemon(t, nil)
	spec := twoStageSpec(url, ns, gitSecret(t, c, ns))
	spec.Stages[0].Timeout = &metav1.Duration{Duration: 2 * time.Second}
	createDeployment(t, c, ns, "two", spec)

	cd := waitDeployment(t, c, ns, "two", "Stalled by the stage timeout", func(cd *capstanv1.ClusterDeployment) bool {
		s := condition(cd, capstanv1.ConditionStalled)
		return s != nil && s.Status == metav1.ConditionTrue
	})
	msg := condition(cd, capstanv1.ConditionStalled).Message
	for _, want := range []string{"stage Infra", "over its timeout of 2s", "Widget/" + ns + "/infra"} {
		if !strings.Contains(msg, want) {
			t.Errorf("Stalled message %q does not contain %q", msg, want)
		}
	}
	if object(t, c, configMapGVK, ns, "app-config") != nil {
		t.Error("stage App was applied although Infra timed out")
	}
}
