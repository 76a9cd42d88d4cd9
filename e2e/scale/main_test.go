// Package scale holds the fleet benchmark of issue #13: many
// ClusterDeployments, each with its own overlay in one git repository,
// reconciled by one `capstan run` process against a real control plane
// and a real git server. It measures what such a fleet costs: the time to
// all Ready, the daemon's peak RSS, its CPU while nothing changes, and the
// requests it sends to the API server and the git server per poll
// interval. BenchmarkThousandDeployments runs the 1,000 x 20
// objects; TestFleetIsReadyAndIdle, run with every `go test ./...`, holds
// a small fleet to the same behaviour as counts.
package scale

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/testenv"
)

var (
	env    *testenv.Env
	gitSrv *gitserver.Server
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
	defer removeBinary()
	return m.Run()
}
