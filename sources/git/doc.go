// Package git is the git implementation of sources.Source. A Source
// follows a branch, a tag, the highest tag within a semver range, a ref
// by its full name, or pins a commit (Ref). Revision is an ls-remote (one
// request, no objects downloaded; none at all for a pinned commit); Fetch
// makes a shallow fetch of that one ref (or commit) into a temporary
// directory and copies the commit's tree into a sources.Builder, so that size limits, path checks and
// symlink rules are applied before anything downstream sees the files.
// The pack is staged on disk and checked object by object before go-git
// indexes it (packCheck), so memory holds at most one object of it, and
// the artifact goes to disk when Options.CacheDir is set. There is no
// worktree.
//
// Supported URLs are https://, http://, ssh://, git://, file:// and the
// scp-like user@host:path. Credentials come from Auth (the deployment's
// secretRef), never from the URL, and never appear in errors.
package git
