// Command genopenapi writes the OpenAPI v3 documents of Kubernetes'
// built-in API groups, as the pinned kube-apiserver (internal/testenv)
// serves them, into one gzipped JSON file: the schemas `capstan validate`
// checks built-in kinds against offline. `go generate ./stages/schema`
// runs it; it starts etcd and kube-apiserver from the test binaries cache
// and needs no network.
package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/discovery"

	"github.com/capstan-dev/capstan/internal/testenv"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "genopenapi:", err)
		os.Exit(1)
	}
}

func run() error {
	out := flag.String("out", "kubernetes-openapi.json.gz", "file to write")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	env, err := testenv.Start(ctx, testenv.Options{Progress: io.Discard})
	if err != nil {
		return fmt.Errorf("start kube-apiserver: %w", err)
	}
	defer env.Stop()
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		return err
	}
	version, err := dc.ServerVersion()
	if err != nil {
		return fmt.Errorf("read the server version: %w", err)
	}
	paths, err := dc.OpenAPIV3().Paths()
	if err != nil {
		return fmt.Errorf("list /openapi/v3: %w", err)
	}
	docs := map[string]json.RawMessage{}
	var names []string
	for path := range paths {
		if builtin(path) {
			names = append(names, path)
		}
	}
	slices.Sort(names)
	for _, path := range names {
		data, err := paths[path].Schema("application/json")
		if err != nil {
			return fmt.Errorf("read /openapi/v3/%s: %w", path, err)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, data); err != nil {
			return fmt.Errorf("/openapi/v3/%s: %w", path, err)
		}
		docs[path] = compact.Bytes()
	}
	if len(docs) == 0 {
		return errors.New("the server serves no built-in group")
	}
	data, err := json.Marshal(struct {
		Version string                     `json:"version"`
		Paths   map[string]json.RawMessage `json:"paths"`
	}{version.GitVersion, docs})
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if _, err := zw.Write(data); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(*out, buf.Bytes(), 0o644)
}

// builtin reports whether an /openapi/v3 path is one of Kubernetes' own
// groups (core, a dotless group, or one under k8s.io), not a CRD's.
func builtin(path string) bool {
	if path == "api/v1" {
		return true
	}
	rest, ok := strings.CutPrefix(path, "apis/")
	if !ok {
		return false
	}
	group, _, ok := strings.Cut(rest, "/")
	return ok && (!strings.Contains(group, ".") || strings.HasSuffix(group, ".k8s.io"))
}
