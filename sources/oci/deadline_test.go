package oci

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A registry that sends a layer's body a byte a second holds a fetch
// only until the caller's deadline: the transport's wait for an answer's
// headers cannot see a body that trickles, the context does.
func TestDeadlineCutsATricklingLayer(t *testing.T) {
	ctx := testContext(t)
	reg := newTestRegistry(t, "", "")
	push(t, ctx, reg.URL("fleet/east"), "v1", overlay(3))
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req, err := http.NewRequestWithContext(r.Context(), r.Method, "http://"+reg.Host+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		req.Header = r.Header.Clone()
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		answer, _ := io.ReadAll(res.Body)
		res.Body.Close()
		for k, v := range res.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(res.StatusCode)
		if !strings.Contains(r.URL.Path, "/blobs/") {
			_, _ = w.Write(answer)
			return
		}
		for i := range answer {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(time.Second):
			}
			if _, err := w.Write(answer[i : i+1]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(func() {
		slow.CloseClientConnections()
		slow.Close()
	})
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
