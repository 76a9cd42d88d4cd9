package stages

import "time"

// RestConfigFrom exposes restConfigFrom to the tests.
var RestConfigFrom = restConfigFrom

// SetResponseHeaderTimeout shortens how long a remote connection waits
// for response headers, for a test, and returns what restores it.
func SetResponseHeaderTimeout(d time.Duration) (restore func()) {
	old := remoteResponseHeaderTimeout
	remoteResponseHeaderTimeout = d
	return func() { remoteResponseHeaderTimeout = old }
}

// RemoteDialTimeout and RemoteTLSHandshakeTimeout are the deadlines a
// remote connection's transport must have.
const (
	RemoteDialTimeout         = remoteDialTimeout
	RemoteTLSHandshakeTimeout = remoteTLSHandshakeTimeout
)
