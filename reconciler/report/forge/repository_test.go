package forge

import "testing"

func TestRepositoryFromURL(t *testing.T) {
	for _, tc := range []struct {
		url, base, want string
	}{
		{"https://github.com/acme/infra.git", "", "acme/infra"},
		{"https://github.com/acme/infra", "", "acme/infra"},
		{"git@github.com:acme/infra.git", "", "acme/infra"},
		{"ssh://git@gitlab.example.com:2222/acme/platform/infra.git", "https://gitlab.example.com", "acme/platform/infra"},
		{"https://example.com/gitea/acme/infra.git", "https://example.com/gitea/", "acme/infra"},
		{"http://127.0.0.1:3000/capstan-admin/infra.git", "http://127.0.0.1:3000", "capstan-admin/infra"},
	} {
		got, err := RepositoryFromURL(tc.url, tc.base)
		if err != nil || got != tc.want {
			t.Errorf("RepositoryFromURL(%q, %q) = %q, %v; want %q", tc.url, tc.base, got, err, tc.want)
		}
	}
	for _, bad := range []string{"https://github.com/infra.git", "/srv/git/infra", "not a url"} {
		if got, err := RepositoryFromURL(bad, ""); err == nil {
			t.Errorf("RepositoryFromURL(%q) = %q, want an error", bad, got)
		}
	}
}
