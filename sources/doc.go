// Package sources defines where Capstan reads cluster definitions from. A
// Source answers two questions: what is the remote revision now (cheap, asked
// on every poll) and what does it contain (an Artifact, fetched only when the
// revision moved). Sub-packages implement it for git, OCI and local folders.
// Everything downstream (render, stages) only ever sees an Artifact.
//
// Every source builds its Artifact.FS with a Builder, the one place that
// enforces what an artifact may hold (regular files inside the root, within
// Limits), in memory or, for the daemon, streamed into a directory of its
// artifact cache (Store) so that artifacts cost disk rather than memory; Symlinks turns the links of an archive or a folder into copies of
// their targets, or refuses them. Sources wrap ErrAuth, ErrNotFound,
// ErrRefused or ErrInvalid into failures that retrying cannot fix, and
// ErrUnavailable into transient ones: each is a failure.Error with its
// reason and policy, which the reconciler reads (failure.From).
package sources
