package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	githubSecret = "gh-secret-Zq81"
	gitlabToken  = "gl-token-Zq81"
	giteaSecret  = "gt-secret-Zq81"
	genericToken = "generic-token-Zq81"
	watchedRepo  = "https://git.example/infra/clusters.git"
)

// recorder is a Trigger that follows one repository's main branch and
// records the calls it gets. With block set, the first call waits until
// block is closed.
type recorder struct {
	block chan struct{}

	mu    sync.Mutex
	calls []string
	first bool
}

func (r *recorder) Match(urls []string, branch string) (string, bool) {
	for _, u := range urls {
		if SameRepository(u, watchedRepo) && (branch == "main" || branch == "") {
			return watchedRepo, true
		}
	}
	return "", false
}

func (r *recorder) Trigger(_ context.Context, repo, branch string) {
	r.mu.Lock()
	r.calls = append(r.calls, repo+"#"+branch)
	wait := r.block != nil && !r.first
	r.first = true
	r.mu.Unlock()
	if wait {
		<-r.block
	}
}

func (r *recorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

// waitCalls waits until the recorder has n calls, or fails after 30s.
func (r *recorder) waitCalls(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c := r.snapshot(); len(c) >= n {
			return c
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("trigger called %d times within 30s, want %d: %v", len(r.snapshot()), n, r.snapshot())
	return nil
}

// serve starts a Handler on 127.0.0.1 for one test.
func serve(t *testing.T, trig Trigger, mutate ...func(*Options)) (*Handler, string) {
	t.Helper()
	opts := Options{
		GitHubSecret: []byte(githubSecret), GitLabToken: []byte(gitlabToken),
		GiteaSecret: []byte(giteaSecret), GenericToken: []byte(genericToken),
		Trigger: trig,
	}
	for _, m := range mutate {
		m(&opts)
	}
	h, err := NewHandler(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h, newLoopbackServer(t, h)
}

// newLoopbackServer serves h under /hooks/ on 127.0.0.1, as the daemon
// mounts it, and returns the base URL.
func newLoopbackServer(t testing.TB, h http.Handler) string {
	mux := http.NewServeMux()
	mux.Handle("/hooks/", http.StripPrefix("/hooks", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/hooks"
}

func sign(secret string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return hex.EncodeToString(mac.Sum(nil))
}

// pushBody is a push payload in the shape GitHub and Gitea send (project
// fields for GitLab).
func pushBody(ref, after string) []byte {
	body, _ := json.Marshal(map[string]any{
		"ref": ref, "after": after,
		"repository": map[string]any{
			"clone_url": watchedRepo, "ssh_url": "git@git.example:infra/clusters.git", "html_url": "https://git.example/infra/clusters",
		},
		"project": map[string]any{"git_http_url": watchedRepo},
	})
	return body
}

// request is one webhook delivery.
type request struct {
	path    string
	method  string
	headers map[string]string
	body    []byte
	chunked bool // send without Content-Length
}

// github, gitlab, gitea and generic build correctly authenticated
// deliveries of body.
func github(event string, body []byte) request {
	return request{path: "/github", headers: map[string]string{"X-GitHub-Event": event, "X-Hub-Signature-256": "sha256=" + sign(githubSecret, body)}, body: body}
}
func gitlab(event string, body []byte) request {
	return request{path: "/gitlab", headers: map[string]string{"X-Gitlab-Event": event, "X-Gitlab-Token": gitlabToken}, body: body}
}
func gitea(event string, body []byte) request {
	return request{path: "/gitea", headers: map[string]string{"X-Gitea-Event": event, "X-Gitea-Signature": sign(giteaSecret, body)}, body: body}
}
func generic(body string) request {
	return request{path: "/generic", headers: map[string]string{"Authorization": "Bearer " + genericToken}, body: []byte(body)}
}

func (r request) with(header, value string) request {
	h := map[string]string{}
	for k, v := range r.headers {
		h[k] = v
	}
	h[header] = value
	r.headers = h
	return r
}

func send(t testing.TB, base string, r request) (int, string) {
	t.Helper()
	method := r.method
	if method == "" {
		method = http.MethodPost
	}
	var body io.Reader = bytes.NewReader(r.body)
	if r.chunked {
		body = io.MultiReader(body) // hides the length: sent chunked
	}
	req, err := http.NewRequest(method, base+r.path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range r.headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

func TestValidPushTriggers(t *testing.T) {
	push := pushBody("refs/heads/main", "4f2c000000000000000000000000000000000001")
	for _, tt := range []struct {
		name string
		req  request
	}{
		{"GitHub", github("push", push)},
		{"GitLab", gitlab("Push Hook", push)},
		{"Gitea", gitea("push", push)},
		{"generic with a branch", generic(`{"url": "git@git.example:infra/clusters.git", "branch": "main"}`)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{}
			_, base := serve(t, rec)
			code, body := send(t, base, tt.req)
			if code != http.StatusAccepted || !strings.Contains(body, `"triggered"`) {
				t.Fatalf("POST = %d %s, want 202 triggered", code, body)
			}
			if calls := rec.waitCalls(t, 1); calls[0] != watchedRepo+"#main" {
				t.Errorf("trigger called with %q, want %q", calls[0], watchedRepo+"#main")
			}
		})
	}
}

// Every delivery below must be answered as listed and trigger nothing.
func TestDeliveriesThatTriggerNothing(t *testing.T) {
	push := pushBody("refs/heads/main", "4f2c000000000000000000000000000000000001")
	big := pushBody("refs/heads/main", strings.Repeat("a", 2<<20))
	tests := []struct {
		name string
		req  request
		code int
		want string
	}{
		{"a wrong GitHub signature", github("push", push).with("X-Hub-Signature-256", "sha256="+sign("wrong", push)), 401, "does not match"},
		{"a missing GitHub signature", github("push", push).with("X-Hub-Signature-256", ""), 401, "missing X-Hub-Signature-256"},
		{"a GitHub signature of another body", github("push", []byte(`{}`)).with("X-Hub-Signature-256", "sha256="+sign(githubSecret, []byte("other"))), 401, "does not match"},
		{"a wrong GitLab token", gitlab("Push Hook", push).with("X-Gitlab-Token", "wrong"), 401, "wrong X-Gitlab-Token"},
		{"a wrong Gitea signature", gitea("push", push).with("X-Gitea-Signature", sign("wrong", push)), 401, "does not match"},
		{"a wrong generic token", generic(`{"url": "x"}`).with("Authorization", "Bearer wrong"), 401, "wrong bearer token"},
		{"an oversized body with a length", github("push", big), 413, "body over 1048576 bytes"},
		{"an oversized body sent chunked", func() request { r := github("push", big); r.chunked = true; return r }(), 413, "body over 1048576 bytes"},
		{"a signed body that is not JSON", github("push", []byte("payload=%7B%7D")), 400, "not JSON"},
		{"a signed push without a ref", github("push", []byte(`{"repository": {"clone_url": "x"}}`)), 400, "no ref"},
		{"a generic body without url", generic(`{"branch": "main"}`), 400, `body has no`},
		{"a GET", request{path: "/github", method: http.MethodGet}, 405, ""},
		{"a push to another branch", github("push", pushBody("refs/heads/feature", "1")), 202, "no source follows"},
		{"a push to another repository", gitea("push", bytes.ReplaceAll(push, []byte("clusters"), []byte("other"))), 202, "no source follows"},
		{"a tag push", gitlab("Push Hook", pushBody("refs/tags/v1", "1")), 202, "not a branch"},
		{"a deleted branch", github("push", pushBody("refs/heads/main", zeroCommit)), 202, "was deleted"},
		{"an issue event", github("issues", []byte(`{}`)), 202, "not a push"},
		{"a ping", github("ping", []byte(`{"zen": "Keep it logically awesome."}`)), 200, "pong"},
	}
	rec := &recorder{}
	_, base := serve(t, rec)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := send(t, base, tt.req)
			if code != tt.code || !strings.Contains(body, tt.want) {
				t.Errorf("POST %s = %d %s, want %d containing %q", tt.req.path, code, body, tt.code, tt.want)
			}
			for _, secret := range []string{githubSecret, gitlabToken, giteaSecret, genericToken} {
				if strings.Contains(body, secret) {
					t.Errorf("response quotes a secret: %s", body)
				}
			}
		})
	}
	// Triggers run in order on one goroutine: once a valid push has
	// triggered, anything the deliveries above had queued would have run.
	send(t, base, gitea("push", push))
	if calls := rec.waitCalls(t, 1); len(calls) != 1 {
		t.Errorf("trigger calls = %v, want only the one valid push", calls)
	}
}

func TestDisabledProvider(t *testing.T) {
	_, base := serve(t, &recorder{}, func(o *Options) { o.GitLabToken = nil })
	push := pushBody("refs/heads/main", "1")
	if code, body := send(t, base, gitlab("Push Hook", push)); code != http.StatusNotFound || !strings.Contains(body, "not enabled") {
		t.Errorf("POST /gitlab with GitLab off = %d %s, want 404", code, body)
	}
	if _, err := NewHandler(Options{Trigger: &recorder{}}); err == nil {
		t.Error("NewHandler with no secret at all = nil error, want one")
	}
}

// Many pushes while a trigger runs become one more trigger, not many.
func TestPushesCoalesce(t *testing.T) {
	rec := &recorder{block: make(chan struct{})}
	h, base := serve(t, rec)
	push := pushBody("refs/heads/main", "1")
	send(t, base, github("push", push))
	rec.waitCalls(t, 1) // the first trigger is running, and blocked

	const pushes = 50
	var wg sync.WaitGroup
	for i := range pushes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := pushBody("refs/heads/main", fmt.Sprint(i))
			if code, resp := send(t, base, github("push", body)); code != http.StatusAccepted {
				t.Errorf("push %d = %d %s", i, code, resp)
			}
		}()
	}
	wg.Wait()
	close(rec.block)
	rec.waitCalls(t, 2)
	h.Close() // waits for the dispatcher: no call can come after this
	if calls := rec.snapshot(); len(calls) != 2 {
		t.Errorf("%d pushes while a trigger ran gave %d more triggers, want 1: %v", pushes, len(calls)-1, calls)
	}
	if code, _ := send(t, base, github("push", push)); code != http.StatusServiceUnavailable {
		t.Errorf("push after Close = %d, want 503", code)
	}
}

func TestNormalizeURL(t *testing.T) {
	for _, tt := range []struct{ a, b string }{
		{"https://github.com/Org/Repo.git", "git@github.com:org/repo"},
		{"https://github.com/org/repo/", "ssh://git@github.com:22/org/repo.git"},
		{"http://127.0.0.1:8080/infra.git", "git://127.0.0.1:9418/infra"},
		{"oci://registry.example/clusters/mgmt", "registry.example/clusters/mgmt"},
	} {
		if !SameRepository(tt.a, tt.b) {
			t.Errorf("SameRepository(%q, %q) = false (%q vs %q)", tt.a, tt.b, NormalizeURL(tt.a), NormalizeURL(tt.b))
		}
	}
	if SameRepository("https://github.com/org/repo", "https://github.com/org/repo2") {
		t.Error("different repositories compared equal")
	}
}
