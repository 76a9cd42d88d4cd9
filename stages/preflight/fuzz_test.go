package preflight_test

import (
	"net/netip"
	"testing"

	"github.com/capstan-dev/capstan/stages/preflight"
)

// FuzzValidate feeds arbitrary values to the keys of the network
// ConfigMap, next to a Cluster and an IPPool, and checks that Validate
// neither panics nor reports a problem it cannot place, and that a report
// without errors means what it says. The seed corpus is in
// testdata/fuzz/FuzzValidate; `go test` runs it, `go test -fuzz
// FuzzValidate` explores from it.
func FuzzValidate(f *testing.F) {
	f.Fuzz(func(t *testing.T, controlPlane, workload, pod, service, httpProxy, httpsProxy, noProxy, sshKeys string) {
		data := map[string]string{
			preflight.KeyControlPlaneCIDRs:  controlPlane,
			preflight.KeyWorkloadPlaneCIDRs: workload,
			preflight.KeyPodCIDR:            pod,
			preflight.KeyServiceCIDR:        service,
			preflight.KeyHTTPProxy:          httpProxy,
			preflight.KeyHTTPSProxy:         httpsProxy,
			preflight.KeyNoProxy:            noProxy,
			preflight.KeySSHAuthorizedKeys:  sshKeys,
		}
		// An empty value stands for an unset key, so that defaults are
		// explored too.
		for k, v := range data {
			if v == "" {
				delete(data, k)
			}
		}
		var clusterPods []any
		if pod != "" {
			clusterPods = []any{pod}
		}
		objects := objs(
			network(data),
			cluster("edge", clusterPods, nil),
			ipPool("nodes", pools(map[string]any{"start": "192.168.10.10", "end": "192.168.10.20"})),
		)
		report := preflight.Validate(objects)

		for _, p := range report.Problems {
			if p.Object == "" || p.Field == "" || p.Message == "" {
				t.Errorf("problem without object, field or message: %+v", p)
			}
		}
		if (report.Err() == nil) != (len(report.Errors()) == 0) {
			t.Errorf("Err() = %v with %d errors", report.Err(), len(report.Errors()))
		}
		if again := preflight.Validate(objects); again.Lines() != report.Lines() {
			t.Errorf("two runs differ:\n%s\n---\n%s", report.Lines(), again.Lines())
		}
		if report.Err() != nil {
			return
		}
		t.Log("no errors") // for -v: the seeds good, defaults and proxies get here
		// Without errors, the networks are canonical and apart.
		for _, n := range report.Networks {
			nodes := append(append([]string(nil), n.ControlPlaneCIDRs...), n.WorkloadPlaneCIDRs...)
			if len(n.ControlPlaneCIDRs) == 0 || len(n.PodCIDRs) != 1 || len(n.ServiceCIDRs) != 1 {
				t.Fatalf("no errors, yet networks are missing: %+v", n)
			}
			pod, service := canonical(t, n.PodCIDRs[0]), canonical(t, n.ServiceCIDRs[0])
			if pod.Overlaps(service) {
				t.Errorf("no errors, yet pods %s overlap services %s", pod, service)
			}
			for _, s := range nodes {
				node := canonical(t, s)
				if node.Overlaps(pod) || node.Overlaps(service) {
					t.Errorf("no errors, yet node network %s overlaps pods %s or services %s", node, pod, service)
				}
				if node.Addr().Is4() != service.Addr().Is4() {
					t.Errorf("no errors, yet node network %s is of another family than services %s", node, service)
				}
			}
		}
	})
}

func canonical(t *testing.T, s string) netip.Prefix {
	t.Helper()
	p, err := netip.ParsePrefix(s)
	if err != nil || p.Masked() != p {
		t.Fatalf("no errors, yet %q is not a canonical CIDR (%v)", s, err)
	}
	return p
}
