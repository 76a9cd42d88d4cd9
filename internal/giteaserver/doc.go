// Package giteaserver runs a real Gitea on 127.0.0.1 for tests: the forge
// that pull-request comments, commit statuses and push webhooks are tested
// against. Start writes an app.ini (SQLite in a temporary directory, no
// mailer, no SSH, offline, webhooks allowed to loopback), runs `gitea
// migrate`, creates an admin user and an access token with the Gitea CLI,
// starts `gitea web` and waits until its API answers. Stop kills it and
// removes its files.
//
// The Gitea binary is built from source by e2e/gitea/build.sh (`make
// gitea`) and cached by version. When it is missing Start fails with an
// error that says so; tests never skip for want of it.
//
// The helpers (CreateRepo, Push, OpenPullRequest, MergePullRequest,
// Comments, CommitStatuses, AddPushWebhook) act as the admin user through
// Gitea's API and the git CLI, so that a test can play the person who opens
// and merges a pull request while the code under test plays Capstan.
package giteaserver
