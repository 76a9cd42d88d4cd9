package git

import (
	"net"
	"net/http"
	"time"

	"github.com/go-git/go-git/v5/plumbing/transport/client"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
)

// Deadlines of every http(s) exchange of go-git in this process: the
// Sources' fetches and revision checks, and the status commits of
// reconciler/report, which go through the same transport. They bound each
// step a server could stall in; the caller's context (the deployment's
// spec.timeout) bounds the whole, which is what cuts a server that
// trickles its answer a byte at a time (docs/deadlines.md).
const (
	httpDialTimeout           = 30 * time.Second
	httpTLSHandshakeTimeout   = 10 * time.Second
	httpResponseHeaderTimeout = time.Minute
	httpIdleConnTimeout       = 90 * time.Second
)

// go-git picks the client of a scheme from a process-wide table, whose
// default for http and https has no deadline to wait for an answer. The
// client installed here is go-git's own with a transport that has them;
// go-git clones that transport for a remote with a CA bundle, deadlines
// included.
func init() {
	c := &http.Client{Transport: newHTTPTransport()}
	client.InstallProtocol("http", githttp.NewClient(c))
	client.InstallProtocol("https", githttp.NewClient(c))
}

// newHTTPTransport returns a clone of http.DefaultTransport (its proxy
// settings from the environment, HTTP/2) with Capstan's deadlines.
func newHTTPTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = (&net.Dialer{Timeout: httpDialTimeout, KeepAlive: 30 * time.Second}).DialContext
	t.TLSHandshakeTimeout = httpTLSHandshakeTimeout
	t.ResponseHeaderTimeout = httpResponseHeaderTimeout
	t.IdleConnTimeout = httpIdleConnTimeout
	return t
}
