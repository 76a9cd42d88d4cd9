package webhook

import (
	"net"
	"net/url"
	"strings"
)

// NormalizeURL reduces a repository URL to what identifies the repository
// across its URL forms: lower-case host and path, without scheme, user,
// port, trailing slash or ".git". https://github.com/Org/Repo.git,
// git@github.com:org/repo and ssh://git@github.com:22/org/repo all become
// github.com/org/repo. oci:// URLs (for the generic endpoint) work alike.
func NormalizeURL(raw string) string {
	raw = strings.TrimSpace(raw)
	var host, path string
	if strings.Contains(raw, "://") {
		u, err := url.Parse(raw)
		if err != nil {
			return strings.ToLower(raw)
		}
		host, path = u.Host, u.Path
	} else if at, rest, ok := strings.Cut(raw, ":"); ok && !strings.Contains(at, "/") {
		// scp-like user@host:path
		host, path = at, rest
		if i := strings.LastIndex(host, "@"); i >= 0 {
			host = host[i+1:]
		}
	} else {
		host, path, _ = strings.Cut(raw, "/")
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	path = strings.Trim(path, "/")
	path = strings.TrimSuffix(path, ".git")
	return strings.ToLower(host + "/" + path)
}

// SameRepository reports whether two URLs name the same repository, by
// NormalizeURL.
func SameRepository(a, b string) bool {
	return NormalizeURL(a) == NormalizeURL(b)
}
