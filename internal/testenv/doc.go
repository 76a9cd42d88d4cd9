// Package testenv runs a real, throw-away Kubernetes control plane on
// loopback for Capstan's tests: etcd, kube-apiserver and, on request,
// kube-controller-manager, built from source by e2e/testbin/build.sh.
//
// Capstan's reconciler applies, waits for and prunes real objects, so its
// tests talk to a real API server instead of fakes: admission, defaulting,
// server-side apply, garbage collection and CRD validation all behave as in
// a cluster. There is no kubelet, so Pods are stored but never run.
//
// A test package starts one control plane in TestMain and gives each test its
// own namespace:
//
//	var env *testenv.Env
//
//	func TestMain(m *testing.M) {
//		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
//		var err error
//		env, err = testenv.Start(ctx, testenv.Options{
//			CRDDirs:  []string{"../../manifests/crds"},
//			Progress: os.Stderr,
//		})
//		cancel()
//		if err != nil {
//			fmt.Fprintln(os.Stderr, err)
//			os.Exit(1)
//		}
//		code := m.Run()
//		if err := env.Stop(); err != nil {
//			fmt.Fprintln(os.Stderr, err)
//		}
//		os.Exit(code)
//	}
//
//	func TestSomething(t *testing.T) {
//		ns, err := env.CreateNamespace(t.Context(), "something")
//		...
//	}
//
// The first run builds the binaries (kube-apiserver takes about six minutes
// on two cores) and caches them; later runs start in a few seconds. Run
// `make testbin` ahead of time to keep that build out of a test's deadline.
//
// The processes die with the test binary (SIGKILL on parent death on Linux),
// so a test that panics or is killed by `go test -timeout` leaves nothing
// running. Each process logs to <Dir>/<binary>.log; start-up errors quote the
// tail of that log.
//
// Without ControllerManager no controller runs: a deleted namespace stays
// Terminating, owner references are not garbage collected and Deployments get
// no ReplicaSets. Set ControllerManager when a test depends on those.
package testenv
