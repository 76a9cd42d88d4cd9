// Package incluster is the end-to-end suite of Capstan running inside a
// cluster: its image, `capstan install`, the daemon as a pod under its own
// ServiceAccount and RBAC, leader election between replicas, and
// `capstan uninstall`. The cluster comes from a backend (e2e/cluster):
// "local", the default, runs a real control plane and a real node (kubelet
// and containerd) on this machine; CAPSTAN_E2E_BACKEND=kind uses kind.
package incluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/e2e/cluster"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/image"
)

// imageRef names the image the suite builds and loads into the nodes.
const imageRef = "capstan.dev/e2e/capstan:incluster"

var (
	cl      cluster.Cluster
	gitSrv  *gitserver.Server
	binPath string // the capstan binary, for `capstan install` and a standby daemon
	workDir string
)

// git credentials the daemon reads from Secret capstan-secrets.
const (
	gitUser     = "capstan"
	gitPassword = "in-cluster-s3cret"
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	backend, err := cluster.FromEnv()
	if err == nil {
		err = backend.Check(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "incluster:", err)
		return 1
	}
	if workDir, err = os.MkdirTemp("", "capstan-incluster-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(workDir)

	begin := time.Now()
	binPath = filepath.Join(workDir, "capstan")
	build := exec.CommandContext(ctx, "go", "build", "-o", binPath, "../../cmd/capstan")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "incluster: build capstan:", err)
		return 1
	}
	tarPath, err := buildImage(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "incluster:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "incluster: capstan binary and image built in %s\n", time.Since(begin).Round(time.Millisecond))

	if cl, err = backend.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "incluster: start cluster:", err)
		return 1
	}
	defer func() {
		if err := cl.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "incluster: stop cluster:", err)
		}
	}()
	begin = time.Now()
	if err := cl.LoadImage(ctx, tarPath); err != nil {
		fmt.Fprintln(os.Stderr, "incluster: load image:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "incluster: image loaded in %s\n", time.Since(begin).Round(time.Millisecond))

	gitSrv, err = gitserver.New("", gitserver.Options{Username: gitUser, Password: gitPassword})
	if err != nil {
		fmt.Fprintln(os.Stderr, "incluster: start git server:", err)
		return 1
	}
	defer gitSrv.Close()
	return m.Run()
}

// buildImage builds Capstan's image for this machine's architecture the way
// `make image` does and writes it as an OCI tarball.
func buildImage(ctx context.Context) (string, error) {
	opts := image.CapstanOptions("e2e", "")
	opts.Dir = "../.."
	opts.Platforms = []string{"linux/" + runtime.GOARCH}
	idx, err := image.Build(ctx, opts)
	if err != nil {
		return "", fmt.Errorf("build image: %w", err)
	}
	path := filepath.Join(workDir, "capstan-image.tar")
	if err := image.WriteOCITarball(path, idx, imageRef); err != nil {
		return "", fmt.Errorf("write image: %w", err)
	}
	return path, nil
}
