package git

import (
	"context"
	"testing"
)

// BenchmarkRevisionUnchanged measures one poll of an unchanged branch over
// http against the package's git server on loopback, and reports the HTTP
// requests it costs (basic auth included).
//
//	go test -run '^$' -bench RevisionUnchanged ./sources/git/
func BenchmarkRevisionUnchanged(b *testing.B) {
	ctx := context.Background()
	if _, err := server.CreateRepo("bench-unchanged"); err != nil {
		b.Fatal(err)
	}
	if _, err := server.Commit("bench-unchanged", "main", map[string]string{"a.yaml": "a"}, "a"); err != nil {
		b.Fatal(err)
	}
	s, err := New(Options{URL: server.HTTPURL("bench-unchanged"), Auth: Auth{Username: testUser, Password: testPassword}})
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
}
