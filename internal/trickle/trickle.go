// Package trickle is a slow-loris server for tests: an HTTP proxy on
// loopback that forwards each request to an upstream server and sends the
// answer back one byte per interval. It answers, so a client that only
// waits for the next byte waits forever; the tests of the sources' and the
// reconciler's deadlines point their clients at it to show that the
// caller's deadline, not the server's pace, bounds an operation.
package trickle

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"
)

// Options say how slow the proxy is.
type Options struct {
	// Interval between two bytes of an answer; one second when zero.
	Interval time.Duration
	// Slow picks the requests whose answers trickle; nil trickles every
	// answer. The others are passed through whole, headers included.
	Slow func(*http.Request) bool
}

// Proxy is a running trickling proxy.
type Proxy struct {
	// URL is the proxy's base URL (http://127.0.0.1:port), which stands in
	// for the upstream's: a request for URL+path goes to upstream+path.
	URL string

	upstream string
	opts     Options
	inFlight atomic.Int64
	srv      *httptest.Server
}

// Start starts a proxy in front of upstream (a base URL such as
// http://127.0.0.1:8080). Close stops it.
func Start(upstream string, opts Options) *Proxy {
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	p := &Proxy{upstream: upstream, opts: opts}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	p.URL = p.srv.URL
	return p
}

// InFlight is the number of requests the proxy is answering now: a test
// reads it to know that a client is held.
func (p *Proxy) InFlight() int64 { return p.inFlight.Load() }

// Close cuts the connections still held and stops the proxy.
func (p *Proxy) Close() {
	p.srv.CloseClientConnections()
	p.srv.Close()
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	p.inFlight.Add(1)
	defer p.inFlight.Add(-1)
	body, _ := io.ReadAll(r.Body)
	req, err := http.NewRequestWithContext(r.Context(), r.Method, p.upstream+r.URL.RequestURI(), bytes.NewReader(body))
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
	slow := p.opts.Slow == nil || p.opts.Slow(r)
	for k, v := range res.Header {
		// A trickled answer goes out chunked, each byte flushed as it is
		// written.
		if !slow || k != "Content-Length" {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(res.StatusCode)
	if !slow {
		_, _ = w.Write(answer)
		return
	}
	flusher, _ := w.(http.Flusher)
	tick := time.NewTicker(p.opts.Interval)
	defer tick.Stop()
	for i := range answer {
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
		}
		if _, err := w.Write(answer[i : i+1]); err != nil {
			return
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
}
