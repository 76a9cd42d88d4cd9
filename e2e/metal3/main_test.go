// Package metal3 is the end-to-end suite of the seed 002 workflow on the
// real Cluster API and Metal3 controllers: Cluster API v1.14 (core,
// kubeadm bootstrap, kubeadm control plane), CAPM3, IPAM and the BareMetal
// Operator in demo mode, built from their Go modules (e2e/providers) and
// run by internal/testenv against a real kube-apiserver, with their
// conversion and admission webhooks served on 127.0.0.1. Only the hardware
// is faked, by BMO's demo provisioner, and the machines, by
// workload-clusters. The walk's tests (create, upgrade, scale) also run on
// the simulator (internal/sim), on a control plane of its own, so that
// the two backends are held to the same assertions.
package metal3

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/testenv"
)

var (
	env *testenv.Env
	// gitSrv serves the repositories the daemon reads the overlays from.
	gitSrv *gitserver.Server
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrl.SetLogger(logr.Discard())
	// Generous: a first run builds the control plane and the six
	// provider binaries.
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	begin := time.Now()
	var err error
	env, err = testenv.Start(ctx, testenv.Options{
		CRDDirs:           []string{"../../manifests/crds"},
		ControllerManager: true,
		Providers:         true,
		Progress:          os.Stderr,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "metal3: start control plane and providers:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "metal3: control plane and providers ready in %s\n", time.Since(begin).Round(time.Millisecond))
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "metal3: stop:", err)
		}
	}()
	// The simulator's control plane: the same CRDs, without their
	// webhooks, and nothing else playing the providers.
	crds, err := testenv.ProviderCRDDirs(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "metal3: provider CRDs:", err)
		return 1
	}
	simEnv, err := testenv.Start(ctx, testenv.Options{
		CRDDirs:           append([]string{"../../manifests/crds"}, crds...),
		ControllerManager: true,
		Progress:          os.Stderr,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "metal3: start the simulator's control plane:", err)
		return 1
	}
	defer func() {
		if err := simEnv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "metal3: stop:", err)
		}
	}()
	backends = []*backend{realProviders(env), simulatedProviders(simEnv)}
	gitSrv, err = gitserver.New("", gitserver.Options{Username: gitUser, Password: gitPassword})
	if err != nil {
		fmt.Fprintln(os.Stderr, "metal3: start git server:", err)
		return 1
	}
	defer gitSrv.Close()
	return m.Run()
}
