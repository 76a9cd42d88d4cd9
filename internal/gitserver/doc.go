// Package gitserver runs real git servers on loopback for tests: `git
// http-backend` behind net/http/cgi (optionally with basic auth), `git
// daemon` for git:// and an SSH server whose exec requests run the real
// `git-upload-pack`. It also creates bare repositories and commits to them
// on disk with the git CLI, so that a test can move a branch without its
// own requests showing up in the server's request counters.
//
// It is test support: the sources tests, the reconciler tests and the e2e
// suites use it in place of a hosted git service. It needs the git CLI on
// PATH and serves only on 127.0.0.1.
package gitserver
