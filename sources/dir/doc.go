// Package dir is the local directory implementation of sources.Source, for
// `capstan dev` and for packing artifacts: the content of a directory on
// this machine, read through os.Root so that nothing outside it is read.
//
// Its revision is a hash of the content ("sha256:<hex>" over every file's
// path, permissions and bytes), so touching a file or rewriting it with the
// same bytes is no new revision. Symlinks inside the directory become copies
// of what they point to, as in every artifact; one that leaves the
// directory is refused, and so are device files, pipes and sockets. A .git
// directory is skipped.
//
// Watch follows the directory with fsnotify and reports, on the channel
// Changes returns, once per burst of writes that changed the revision, so
// that an editor saving a file in several steps wakes the reconciler once.
package dir
