package stages

import "time"

// SetCRDEstablishTimeout shortens how long Apply waits for the CRDs of a
// stage to be Established, for a test, and returns what restores it.
func SetCRDEstablishTimeout(d time.Duration) (restore func()) {
	old := crdEstablishTimeout
	crdEstablishTimeout = d
	return func() { crdEstablishTimeout = old }
}

// IsNetworkError exposes isNetworkError to the tests.
var IsNetworkError = isNetworkError
