// Package git is the git implementation of sources.Source. Revision is an
// ls-remote (one request, no objects downloaded); Fetch makes a shallow,
// single-branch clone into memory and copies the commit's tree into a
// sources.MemFSBuilder, so that size limits, path checks and symlink rules
// are applied before anything downstream sees the files. There is no
// worktree and nothing is written to disk.
//
// Supported URLs are https://, http://, ssh://, git://, file:// and the
// scp-like user@host:path. Credentials come from Auth (the deployment's
// secretRef), never from the URL, and never appear in errors.
package git
