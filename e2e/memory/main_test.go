// Package memory holds the test of issue #13 part 4, "bounded memory,
// whatever the input": the capstan binary, run as its own process against
// a real control plane, a real git server and a real OCI registry, meets
// hostile sources, and its peak RSS is measured against the memory limit
// manifests/ ships.
package memory

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-containerregistry/pkg/registry"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/testenv"
)

var (
	env          *testenv.Env
	gitSrv       *gitserver.Server
	registryHost string // host:port of the OCI registry
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Getenv("CAPSTAN_E2E_LOG") != "" {
		ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, nil)))
	} else {
		ctrl.SetLogger(logr.Discard())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var err error
	env, err = testenv.Start(ctx, testenv.Options{CRDDirs: []string{"../../manifests/crds"}, Progress: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start control plane:", err)
		return 1
	}
	defer env.Stop()
	gitSrv, err = gitserver.New("", gitserver.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start git server:", err)
		return 1
	}
	defer gitSrv.Close()
	// go-containerregistry's registry: the distribution API, blobs in
	// this test process's memory, not the daemon's.
	srv := httptest.NewUnstartedServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "start registry:", err)
		return 1
	}
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	defer srv.Close()
	registryHost = ln.Addr().String()
	return m.Run()
}
