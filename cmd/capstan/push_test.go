package main

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/capstan-dev/capstan/render"
	"github.com/capstan-dev/capstan/sources"
	"github.com/capstan-dev/capstan/sources/oci"
)

// startRegistry serves go-containerregistry's in-memory registry on
// 127.0.0.1 for one test and returns its host:port and a counter of the
// manifest uploads it received.
func startRegistry(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	var manifestPuts atomic.Int64
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/manifests/") {
			manifestPuts.Add(1)
		}
		inner.ServeHTTP(w, r)
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return ln.Addr().String(), &manifestPuts
}

// The round trip of the issue: push the examples directory, read it back
// with the OCI source the daemon uses, and render the demo overlay: the
// objects must equal those rendered from the directory itself.
func TestPushArtifactRoundTrip(t *testing.T) {
	host, _ := startRegistry(t)
	url := "oci://" + host + "/clusters/examples"
	out, err := runCLI(t, "push", "artifact", url, "--path", "../../examples", "--tag", "v1.0.0",
		"--revision", "main@sha1:0123456789abcdef0123456789abcdef01234567")
	if err != nil {
		t.Fatalf("push artifact: %v\n%s", err, out)
	}
	if !strings.Contains(out, "revision: v1.0.0@sha256:") {
		t.Errorf("push artifact printed %q, want the revision", out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src, err := oci.New(oci.Options{URL: url, Ref: oci.Ref{SemVer: "^1.0"}})
	if err != nil {
		t.Fatal(err)
	}
	art, err := src.Fetch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, art.Revision) {
		t.Errorf("the source read revision %q, push printed %q", art.Revision, out)
	}
	opts := render.DefaultOptions()
	opts.Path = "clusters/demo/overlay"
	fromArtifact, err := render.Build(ctx, art.FS, opts)
	if err != nil {
		t.Fatal(err)
	}
	fromDir, err := render.Build(ctx, os.DirFS("../../examples"), opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(fromDir) == 0 || len(fromArtifact) != len(fromDir) {
		t.Fatalf("rendered %d objects from the artifact, %d from the directory", len(fromArtifact), len(fromDir))
	}
	for i := range fromDir {
		if !reflect.DeepEqual(fromArtifact[i].Object, fromDir[i].Object) {
			t.Errorf("object %d differs:\nartifact:  %v\ndirectory: %v", i, fromArtifact[i].Object, fromDir[i].Object)
		}
	}
}

func TestPushArtifactRefusesAnEscapingSymlink(t *testing.T) {
	host, puts := startRegistry(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ok.yaml"), []byte("kind: ConfigMap\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../etc/passwd", filepath.Join(dir, "passwd")); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, "push", "artifact", "oci://"+host+"/x", "--path", dir)
	if !errors.Is(err, sources.ErrRefused) || !strings.Contains(err.Error(), "symlink passwd") || !strings.Contains(err.Error(), "outside the artifact root") {
		t.Fatalf("push artifact = %v (%s), want a refusal naming the symlink", err, out)
	}
	if puts.Load() != 0 {
		t.Errorf("%d manifests were pushed despite the refusal", puts.Load())
	}
}
