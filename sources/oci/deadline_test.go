package oci

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/trickle"
)

// A registry that sends a layer's body a byte a second holds a fetch
// only until the caller's deadline: the transport's wait for an answer's
// headers cannot see a body that trickles, the context does.
func TestDeadlineCutsATricklingLayer(t *testing.T) {
	ctx := testContext(t)
	reg := newTestRegistry(t, "", "")
	push(t, ctx, reg.URL("fleet/east"), "v1", overlay(3))
	slow := trickle.Start("http://"+reg.Host, trickle.Options{
		Interval: time.Second,
		Slow:     func(r *http.Request) bool { return strings.Contains(r.URL.Path, "/blobs/") },
	})
	t.Cleanup(slow.Close)
	src := newSource(t, Options{URL: "oci://" + strings.TrimPrefix(slow.URL, "http://") + "/fleet/east", Ref: Ref{Tag: "v1"}})
	fetchCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := src.Fetch(fetchCtx)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Error("the fetch of a trickling layer succeeded within its deadline; the registry was meant to be too slow")
		}
	case <-time.After(time.Minute):
		t.Fatal("the fetch of a trickling layer still runs a minute after its deadline")
	}
}
