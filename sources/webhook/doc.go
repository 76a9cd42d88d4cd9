// Package webhook receives push notifications from git hosts so that a
// push is fetched within a second instead of at the next poll.
//
// Handler is an http.Handler with one endpoint per provider, each enabled
// by its secret: POST /github (X-Hub-Signature-256, HMAC-SHA256 of the
// body), /gitlab (X-Gitlab-Token), /gitea (X-Gitea-Signature, HMAC-SHA256)
// and /generic (Authorization: Bearer <token>, body {"url": ..., "branch":
// ...}). Mount it under a prefix with http.StripPrefix.
//
// Responses: 413 for a body over Options.MaxBodyBytes, 401 for a missing or
// wrong signature or token, 400 for a payload that does not parse or lacks
// the repository or ref, 404 for a provider whose secret is not set, 405
// for anything but POST. An authentic push that no source follows (another
// branch, another repository, a tag, a deleted branch) and any other
// authentic event get 202 with status "ignored" and the reason: the sender
// did nothing wrong, and git hosts flag (GitLab eventually disables) hooks
// that keep failing with 4xx. A GitHub ping gets 200. Only an authentic
// push for a watched repository and branch (202, status "triggered")
// reaches the Trigger.
//
// Work is never amplified: triggers run on one goroutine, and any number of
// pushes for a repository and branch that arrive while it is busy are
// merged into one more call.
package webhook
