//go:build tools

// Package gitea pins the Gitea server that build.sh compiles and that
// internal/giteaserver starts for tests: the real forge the pull-request
// comments and commit statuses are tested against.
package gitea

import (
	_ "code.gitea.io/gitea"
)
