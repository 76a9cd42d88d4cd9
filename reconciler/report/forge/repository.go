package forge

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// scpLike matches git's scp-like address, user@host:path.
var scpLike = regexp.MustCompile(`^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:([^/].*)$`)

// RepositoryFromURL derives the repository a forge knows (owner/name, or a
// GitLab project path) from the git URL Capstan reads: its path without
// .git, and without the path of baseURL when the forge is served under one
// (https://example.com/gitea). It is the default of
// spec.report.pullRequests.repository.
func RepositoryFromURL(gitURL, baseURL string) (string, error) {
	var p string
	if m := scpLike.FindStringSubmatch(gitURL); m != nil {
		p = m[1]
	} else {
		u, err := url.Parse(gitURL)
		if err != nil || u.Host == "" {
			return "", fmt.Errorf("derive the forge repository from git URL %q: not a URL with a host; set spec.report.pullRequests.repository", gitURL)
		}
		p = u.Path
		if b, err := url.Parse(baseURL); err == nil && b.Host == u.Host {
			p = strings.TrimPrefix(p, strings.TrimSuffix(b.Path, "/"))
		}
	}
	p = strings.TrimSuffix(strings.Trim(p, "/"), ".git")
	if !strings.Contains(p, "/") || strings.Contains(p, "//") {
		return "", fmt.Errorf("derive the forge repository from git URL %q: path %q is not owner/name; set spec.report.pullRequests.repository", gitURL, p)
	}
	return p, nil
}
