package git

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkRevisionUnchanged measures one poll of an unchanged remote over
// http against the package's git server on loopback, for each kind of
// ref, and reports the HTTP requests it costs (basic auth included). The
// repository holds 100 tags, so that a semver range has some to choose
// from.
//
//	go test -run '^$' -bench RevisionUnchanged ./sources/git/
func BenchmarkRevisionUnchanged(b *testing.B) {
	ctx := context.Background()
	const repo = "bench-unchanged"
	if _, err := server.CreateRepo(repo); err != nil {
		b.Fatal(err)
	}
	head, err := server.Commit(repo, "main", map[string]string{"a.yaml": "a"}, "a")
	if err != nil {
		b.Fatal(err)
	}
	for i := range 100 {
		inRepo(b, repo, "tag", fmt.Sprintf("v1.%d.0", i), head)
	}
	for _, kind := range []struct {
		name string
		ref  Ref
	}{
		{"branch", Ref{Branch: "main"}},
		{"tag", Ref{Tag: "v1.0.0"}},
		{"semver", Ref{SemVer: "^1"}},
		{"commit", Ref{Commit: head}},
	} {
		b.Run(kind.name, func(b *testing.B) {
			s, err := New(Options{URL: server.HTTPURL(repo), Ref: kind.ref, Auth: Auth{Username: testUser, Password: testPassword}})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := s.Revision(ctx); err != nil {
				b.Fatal(err)
			}
			before := server.Requests()
			for b.Loop() {
				if _, err := s.Revision(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(server.Requests()-before)/float64(b.N), "requests/poll")
		})
	}
}
