package schema

import (
	"bytes"
	"compress/gzip"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"sync"

	k8sschema "k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/openapi"
)

// kubernetesOpenAPI holds the OpenAPI v3 documents of Kubernetes'
// built-in groups as the pinned kube-apiserver serves them (about 600 KB
// gzipped, 22 group versions); `go generate` writes it
// (internal/genopenapi, run by go generate ./stages/schema).
//
//go:embed kubernetes-openapi.json.gz
var kubernetesOpenAPI []byte

// embedded is the decoded kubernetesOpenAPI.
type embedded struct {
	once    sync.Once
	version string
	paths   map[string]json.RawMessage
	err     error
}

var kubernetes embedded

func (e *embedded) load() error {
	e.once.Do(func() {
		zr, err := gzip.NewReader(bytes.NewReader(kubernetesOpenAPI))
		if err != nil {
			e.err = err
			return
		}
		data, err := io.ReadAll(zr)
		if err != nil {
			e.err = err
			return
		}
		var doc struct {
			Version string                     `json:"version"`
			Paths   map[string]json.RawMessage `json:"paths"`
		}
		if e.err = json.Unmarshal(data, &doc); e.err == nil {
			e.version, e.paths = doc.Version, doc.Paths
		}
	})
	if e.err != nil {
		return fmt.Errorf("read the embedded Kubernetes OpenAPI documents: %w", e.err)
	}
	return nil
}

// Document returns the embedded document of gv.
func (e *embedded) Document(_ context.Context, gv k8sschema.GroupVersion) ([]byte, error) {
	if err := e.load(); err != nil {
		return nil, err
	}
	return e.paths[Path(gv)], nil
}

// Kubernetes returns the OpenAPI documents of Kubernetes' built-in API
// groups for the Kubernetes version the project pins (KubernetesVersion),
// embedded in the binary: what `capstan validate` checks built-in kinds
// against without a cluster.
func Kubernetes() Documents { return &kubernetes }

// KubernetesVersion is the version of kube-apiserver the embedded
// documents were read from.
func KubernetesVersion() string {
	if kubernetes.load() != nil {
		return ""
	}
	return kubernetes.version
}

// clusterDocuments reads documents from a cluster's /openapi/v3.
type clusterDocuments struct {
	client openapi.Client

	once  sync.Once
	paths map[string]openapi.GroupVersion
	err   error
}

// Cluster returns the documents a cluster serves at /openapi/v3 (a
// discovery client's OpenAPIV3()), read on demand: one request for the
// index, one per group version asked for.
func Cluster(c openapi.Client) Documents { return &clusterDocuments{client: c} }

// Document returns the cluster's document of gv, nil when it serves none.
func (c *clusterDocuments) Document(ctx context.Context, gv k8sschema.GroupVersion) ([]byte, error) {
	c.once.Do(func() { c.paths, c.err = c.client.Paths() })
	if c.err != nil {
		return nil, fmt.Errorf("list the cluster's OpenAPI documents: %w", c.err)
	}
	p, ok := c.paths[Path(gv)]
	if !ok {
		return nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	data, err := p.Schema("application/json")
	if err != nil {
		return nil, fmt.Errorf("read the cluster's OpenAPI document of %s: %w", gv, err)
	}
	return data, nil
}
