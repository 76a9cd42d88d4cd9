package manifests

import "testing"

func TestDaemonContainerIsTheShippedOne(t *testing.T) {
	ctr, err := DaemonContainer()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ctr.Resources.Limits["memory"]; !ok {
		t.Errorf("container %s has no memory limit", ctr.Name)
	}
	if Env(ctr, "GOMEMLIMIT") == "" {
		t.Errorf("container %s sets no GOMEMLIMIT", ctr.Name)
	}
	if Env(ctr, "NO_SUCH_VARIABLE") != "" {
		t.Error("Env returns a value for a variable that is not set")
	}
}
