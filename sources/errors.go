package sources

import "errors"

// The errors below give a source failure its policy. A source wraps one of
// them (with %w, next to the underlying cause) when retrying with the same
// settings cannot help; the reconciler then reports the deployment as stalled
// and polls slowly instead of hot-looping. Any other error is retryable:
// network trouble, a server that answered 5xx, a context deadline.
var (
	// ErrAuth means the remote refused the credentials, or wanted some and
	// got none.
	ErrAuth = errors.New("authentication failed")
	// ErrNotFound means the repository, branch, tag or path does not exist
	// on the remote.
	ErrNotFound = errors.New("not found")
	// ErrRefused means the content was fetched but Capstan will not use it:
	// it breaks a size limit, has a path or symlink that leaves the artifact
	// root, or has a file type an artifact cannot hold.
	ErrRefused = errors.New("content refused")
	// ErrInvalid means the source's own settings are wrong: a malformed URL,
	// an unsupported scheme, an unparsable key.
	ErrInvalid = errors.New("invalid source settings")
)

// IsStalled reports whether err is one that needs a human to change the
// source or its settings before a retry can succeed.
func IsStalled(err error) bool {
	return errors.Is(err, ErrAuth) || errors.Is(err, ErrNotFound) ||
		errors.Is(err, ErrRefused) || errors.Is(err, ErrInvalid)
}
