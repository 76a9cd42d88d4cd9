// Package forge talks to the forges where pull requests live: GitHub
// (go-github), Gitea (its Go SDK) and GitLab (gitlab.com/gitlab-org/api/
// client-go), behind one small interface, Forge. Capstan uses it to find
// the open pull requests against the branch a deployment reads, to keep ONE
// comment per pull request with the plan and then the rollout (found again
// by a hidden marker and edited in place), and to set a commit status on
// the merge commit as the rollout goes.
//
// The package only talks to the forge: what the comment and the status say
// is the reconciler's judgement. A provider takes a token string and,
// for a forge with a private CA, the CA's certificates (Config.CABundle,
// trusted beside the system roots); ReadCredentials reads both from a
// Secret. Errors name the forge, the repository, the pull
// request or commit and what to check; the token never appears in them.
// docs/forges.md describes the configuration and the token scopes.
package forge
