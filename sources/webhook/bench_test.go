package webhook

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/sources/git"
)

// BenchmarkPushToRevision measures, with real parts on loopback, the
// latency from the git host's webhook POST to the new revision being seen
// through the git source (one ls-remote), which is what the reconciler
// does when triggered. Each iteration commits first, outside the timing.
//
//	go test -run '^$' -bench PushToRevision -benchtime 20x ./sources/webhook/
func BenchmarkPushToRevision(b *testing.B) {
	srv, err := gitserver.New("", gitserver.Options{Username: "capstan", Password: "pw-Zq81"})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	if _, err := srv.CreateRepo("infra"); err != nil {
		b.Fatal(err)
	}
	if _, err := srv.Commit("infra", "main", map[string]string{"a.yaml": "0"}, "0"); err != nil {
		b.Fatal(err)
	}
	src, err := git.New(git.Options{URL: srv.HTTPURL("infra"), Branch: "main", Auth: git.Auth{Username: "capstan", Password: "pw-Zq81"}})
	if err != nil {
		b.Fatal(err)
	}
	trig := &gitTrigger{src: src, revs: make(chan string, 16)}
	h, err := NewHandler(Options{GitHubSecret: []byte(githubSecret), Trigger: trig})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	hs := newLoopbackServer(b, h)
	var total time.Duration
	i := 0
	for b.Loop() {
		i++
		hash, err := srv.Commit("infra", "main", map[string]string{"a.yaml": fmt.Sprint(i)}, "next")
		if err != nil {
			b.Fatal(err)
		}
		body := []byte(`{"ref": "refs/heads/main", "after": "` + hash + `", "repository": {"clone_url": "` + srv.HTTPURL("infra") + `"}}`)
		start := time.Now()
		if code, resp := send(b, hs, github("push", body)); code != http.StatusAccepted {
			b.Fatalf("POST = %d %s", code, resp)
		}
		if rev := <-trig.revs; !strings.HasSuffix(rev, hash) {
			b.Fatalf("revision %q, want %s", rev, hash)
		}
		total += time.Since(start)
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(i), "ms/push-to-revision")
}
