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
// Options.Node adds a node on which pods really run: containerd (Debian's
// package, `make tools`) with its own config, socket, root and state under
// Dir, kube-scheduler, and a kubelet for cgroup v1 or v2 with the cgroupfs
// driver, its pods under a cgroup root of their own. The sandbox image is
// a small Go program (pause/) built with go-containerregistry and imported
// with ctr, so no registry is needed; ImportImage brings in others. The node
// has no CNI and no kube-proxy: pods run with hostNetwork, must tolerate the
// node.kubernetes.io/not-ready taint (the node stays NotReady for want of a
// network plugin), and reach the API server at PodAPIServer() through
// KUBERNETES_SERVICE_HOST and _PORT. The kubelet refuses a loopback node
// address, so the API server cannot reach it for `kubectl logs`; PodLogs
// reads the log files instead. Stop deletes the pods and waits for the
// kubelet to stop them, then kills whatever is left in the node's cgroups
// and containerd's shims, and unmounts what is still mounted under Dir; a
// later Start sweeps what a test binary killed mid-run left behind.
//
// Without ControllerManager no controller runs: a deleted namespace stays
// Terminating, owner references are not garbage collected and Deployments get
// no ReplicaSets. Set ControllerManager when a test depends on those.
package testenv
