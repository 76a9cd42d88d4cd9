package pivot

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/testenv"
)

// source and target are two real control planes with the Cluster API,
// Metal3 and Capstan CRDs, and no controllers: what a move does is all
// that changes them.
var sourceEnv, targetEnv *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	crds, err := testenv.ProviderCRDDirs(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pivot: provider CRDs:", err)
		return 1
	}
	opts := testenv.Options{CRDDirs: append([]string{"../../manifests/crds"}, crds...), Progress: os.Stderr}
	if sourceEnv, err = testenv.Start(ctx, opts); err != nil {
		fmt.Fprintln(os.Stderr, "pivot: start the source:", err)
		return 1
	}
	defer sourceEnv.Stop()
	if targetEnv, err = testenv.Start(ctx, opts); err != nil {
		fmt.Fprintln(os.Stderr, "pivot: start the target:", err)
		return 1
	}
	defer targetEnv.Stop()
	return m.Run()
}
