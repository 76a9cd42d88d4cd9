package forge

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// githubContract is a fake of the GitHub REST API (as a GitHub Enterprise
// Server serves it, under /api/v3) that implements only the documented
// endpoints the GitHub provider calls, for the repository acme/infra and
// its pull requests 7 and 9.
type githubContract struct {
	t     *testing.T
	token string

	mu       sync.Mutex
	nextID   int64
	comments map[int][]map[string]any // by issue number, oldest first
	statuses map[string][]map[string]any
}

func newGitHubContract(t *testing.T, token string) (*githubContract, *httptest.Server) {
	g := &githubContract{t: t, token: token, nextID: 1000,
		comments: map[int][]map[string]any{7: nil, 9: nil}, statuses: map[string][]map[string]any{}}
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	return g, srv
}

// addComment stores a comment as another user would have written it.
func (g *githubContract) addComment(issue int, login, body string) map[string]any {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.addCommentLocked(issue, login, body)
}

func (g *githubContract) addCommentLocked(issue int, login, body string) map[string]any {
	g.nextID++
	c := loadObject(g.t, "github/issue-comment.json")
	c["id"] = g.nextID
	c["body"] = body
	c["url"] = fmt.Sprintf("https://api.github.com/repos/acme/infra/issues/comments/%d", g.nextID)
	c["html_url"] = fmt.Sprintf("https://github.com/acme/infra/pull/%d#issuecomment-%d", issue, g.nextID)
	c["user"].(map[string]any)["login"] = login
	g.comments[issue] = append(g.comments[issue], c)
	return c
}

func (g *githubContract) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	auth := r.Header.Get("Authorization")
	if auth != "Bearer "+g.token && auth != "token "+g.token {
		writeJSON(w, http.StatusUnauthorized, loadJSON(g.t, "github/error-bad-credentials.json"))
		return
	}
	path, ok := strings.CutPrefix(r.URL.Path, "/api/v3/repos/")
	if !ok {
		writeJSON(w, http.StatusNotFound, loadJSON(g.t, "github/error-not-found.json"))
		return
	}
	if strings.HasPrefix(path, "echo/") {
		// A misbehaving proxy that repeats the request's credentials in
		// its error: the provider must still not pass them on.
		writeJSON(w, http.StatusBadGateway, map[string]any{"message": "upstream refused " + auth})
		return
	}
	rest, ok := strings.CutPrefix(path, "acme/infra/")
	if !ok {
		writeJSON(w, http.StatusNotFound, loadJSON(g.t, "github/error-not-found.json"))
		return
	}
	parts := strings.Split(rest, "/")
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case r.Method == http.MethodGet && rest == "pulls":
		g.listPulls(w, r)
	case r.Method == http.MethodGet && len(parts) == 3 && parts[0] == "commits" && parts[2] == "pulls":
		// Only the merge commit and the head of pull request 5 belong to
		// a pull request.
		var out []any
		for _, pr := range loadJSON(g.t, "github/commit-pulls.json").([]any) {
			m := pr.(map[string]any)
			if m["merge_commit_sha"] == parts[1] || m["head"].(map[string]any)["sha"] == parts[1] {
				out = append(out, pr)
			}
		}
		items, _, link := page(r, out, 30, 100)
		w.Header().Set("Link", link)
		writeJSON(w, http.StatusOK, items)
	case len(parts) == 3 && parts[0] == "issues" && parts[2] == "comments":
		n, _ := strconv.Atoi(parts[1])
		if _, ok := g.comments[n]; !ok {
			writeJSON(w, http.StatusNotFound, loadJSON(g.t, "github/error-not-found.json"))
			return
		}
		switch r.Method {
		case http.MethodGet:
			items, _, link := page(r, g.comments[n], 30, 100)
			w.Header().Set("Link", link)
			writeJSON(w, http.StatusOK, items)
		case http.MethodPost:
			body, ok := g.commentBody(w, r)
			if ok {
				writeJSON(w, http.StatusCreated, g.addCommentLocked(n, "capstan-bot", body))
			}
		default:
			w.WriteHeader(http.StatusMethodNotAllowed)
		}
	case r.Method == http.MethodPatch && len(parts) == 3 && parts[0] == "issues" && parts[1] == "comments":
		id, _ := strconv.ParseInt(parts[2], 10, 64)
		for _, cs := range g.comments {
			for _, c := range cs {
				if jsonID(c["id"]) != id {
					continue
				}
				body, ok := g.commentBody(w, r)
				if ok {
					c["body"] = body
					c["updated_at"] = time.Now().UTC().Format(time.RFC3339)
					writeJSON(w, http.StatusOK, c)
				}
				return
			}
		}
		writeJSON(w, http.StatusNotFound, loadJSON(g.t, "github/error-not-found.json"))
	case r.Method == http.MethodPost && len(parts) == 2 && parts[0] == "statuses":
		var in struct {
			State       string  `json:"state"`
			TargetURL   *string `json:"target_url"`
			Description string  `json:"description"`
			Context     string  `json:"context"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || !strings.Contains("pending success failure error", in.State) || in.State == "" {
			writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"message": "Validation Failed"})
			return
		}
		st := loadObject(g.t, "github/status.json")
		st["state"], st["description"], st["context"] = in.State, in.Description, in.Context
		if in.Context == "" {
			st["context"] = "default"
		}
		if in.TargetURL != nil {
			st["target_url"] = *in.TargetURL
		}
		g.statuses[parts[1]] = append(g.statuses[parts[1]], st)
		writeJSON(w, http.StatusCreated, st)
	default:
		writeJSON(w, http.StatusNotFound, loadJSON(g.t, "github/error-not-found.json"))
	}
}

// jsonID reads an ID loaded from JSON (float64) or set by the fake
// (int64).
func jsonID(v any) int64 {
	switch x := v.(type) {
	case float64:
		return int64(x)
	case int64:
		return x
	}
	return -1
}

func (g *githubContract) listPulls(w http.ResponseWriter, r *http.Request) {
	if s := r.URL.Query().Get("state"); s != "open" {
		g.t.Errorf("GitHub pulls listed with state=%q, want open", s)
	}
	var out []any
	for _, pr := range loadJSON(g.t, "github/pulls.json").([]any) {
		base := pr.(map[string]any)["base"].(map[string]any)["ref"]
		if b := r.URL.Query().Get("base"); b == "" || b == base {
			out = append(out, pr)
		}
	}
	items, _, link := page(r, out, 30, 100)
	w.Header().Set("Link", link)
	writeJSON(w, http.StatusOK, items)
}

// commentBody reads a comment's body, refusing one over GitHub's limit as
// GitHub does.
func (g *githubContract) commentBody(w http.ResponseWriter, r *http.Request) (string, bool) {
	var in struct {
		Body string `json:"body"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Body == "" {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"message": "Validation Failed"})
		return "", false
	}
	if countRunes(in.Body) > 65536 {
		writeJSON(w, http.StatusUnprocessableEntity, loadJSON(g.t, "github/error-validation.json"))
		return "", false
	}
	return in.Body, true
}

func (g *githubContract) ourComments(issue int, key string) []map[string]any {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []map[string]any
	for _, c := range g.comments[issue] {
		if strings.HasPrefix(c["body"].(string), Marker(key)) {
			out = append(out, c)
		}
	}
	return out
}

func newTestGitHub(t *testing.T, url, token string) *GitHub {
	t.Helper()
	f, err := NewGitHub(Config{BaseURL: url, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestGitHubAgainstDocumentedContract(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Forks are listed and said to be: a fork's (9), a deleted fork's,
	// whose head repository GitHub reports as null (13), a collaborator's
	// (15). The author association is GitHub's, mapped: MEMBER and
	// COLLABORATOR are trusted, CONTRIBUTOR and FIRST_TIME_CONTRIBUTOR
	// are not.
	t.Run("open pull requests against the branch are listed, forks included and said to be", func(t *testing.T) {
		_, srv := newGitHubContract(t, plantedToken)
		prs, err := newTestGitHub(t, srv.URL, plantedToken).OpenPullRequests(ctx, "acme/infra", "main")
		if err != nil {
			t.Fatal(err)
		}
		want := []PullRequest{
			{Number: 7, Title: "Scale workload-a to 5 workers", HeadSHA: "6dcb09b5b57875f334f61aebed695e2e4193db5e", HeadRef: "scale-workload-a",
				HeadFetchRef: "refs/pull/7/head", BaseRef: "main", URL: "https://github.com/acme/infra/pull/7",
				Author: "octo-operator", Association: AssociationMember},
			{Number: 9, Title: "Kubernetes v1.35.4 for workload-b", HeadSHA: "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678", HeadRef: "k8s-1.35",
				HeadFetchRef: "refs/pull/9/head", BaseRef: "main", URL: "https://github.com/acme/infra/pull/9",
				Fork: true, Author: "contractor"},
			{Number: 13, Title: "Drop the bastion", HeadSHA: "1357913579135791357913579135791357913579", HeadRef: "drop-bastion",
				HeadFetchRef: "refs/pull/13/head", BaseRef: "main", URL: "https://github.com/acme/infra/pull/13",
				Fork: true, Author: "ghost"},
			{Number: 15, Title: "Rotate the etcd CA", HeadSHA: "2468024680246802468024680246802468024680", HeadRef: "etcd-ca",
				HeadFetchRef: "refs/pull/15/head", BaseRef: "main", URL: "https://github.com/acme/infra/pull/15",
				Fork: true, Author: "octo-collab", Association: AssociationCollaborator},
		}
		for i, trusted := range []bool{true, false, false, true} {
			if i < len(prs) && prs[i].TrustedAuthor() != trusted {
				t.Errorf("pull request %d: trusted author = %v, want %v", prs[i].Number, prs[i].TrustedAuthor(), trusted)
			}
		}
		if fmt.Sprint(prs) != fmt.Sprint(want) {
			t.Errorf("open pull requests:\n got %+v\nwant %+v", prs, want)
		}
	})

	t.Run("one comment is created, edited in place, then left alone, past a page of other comments", func(t *testing.T) {
		g, srv := newGitHubContract(t, plantedToken)
		for i := range 130 {
			g.addComment(7, "reviewer", fmt.Sprintf("comment %d", i))
		}
		g.addComment(7, "reviewer", "> "+Marker("plan")+"\n> quoted, not ours")
		f := newTestGitHub(t, srv.URL, plantedToken)
		assertUpserts(t, ctx, f, "acme/infra", 7, func() []string {
			var bodies []string
			for _, c := range g.ourComments(7, "plan") {
				bodies = append(bodies, c["body"].(string))
			}
			return bodies
		})
	})

	t.Run("the comment is read back past a page of others, and no other is taken for it", func(t *testing.T) {
		g, srv := newGitHubContract(t, plantedToken)
		for i := range 130 {
			g.addComment(7, "reviewer", fmt.Sprintf("comment %d", i))
		}
		assertReadComment(t, ctx, newTestGitHub(t, srv.URL, plantedToken), "acme/infra", 7, func(body string) { g.addComment(7, "reviewer", body) })
	})

	t.Run("a body over GitHub's limit is cut with a note and accepted", func(t *testing.T) {
		g, srv := newGitHubContract(t, plantedToken)
		body := "```diff\n" + strings.Repeat("+ replicas: 5 # a line of the plan\n", 3000) + "```\n"
		c, err := newTestGitHub(t, srv.URL, plantedToken).UpsertComment(ctx, "acme/infra", 7, "plan", body)
		if err != nil {
			t.Fatal(err)
		}
		if c.Action != CommentCreated {
			t.Errorf("action = %s, want created", c.Action)
		}
		ours := g.ourComments(7, "plan")
		if len(ours) != 1 {
			t.Fatalf("%d comments with the marker, want 1", len(ours))
		}
		got := ours[0]["body"].(string)
		if countRunes(got) > GitHubCommentLimit || !WasCut(got) || strings.Count(got, "```")%2 != 0 {
			t.Errorf("stored body: %d characters, cut note %v, balanced fences %v",
				countRunes(got), strings.Contains(got, "**Cut:**"), strings.Count(got, "```")%2 == 0)
		}
	})

	t.Run("a merge commit and a merged head lead to their pull request; another commit to none", func(t *testing.T) {
		_, srv := newGitHubContract(t, plantedToken)
		f := newTestGitHub(t, srv.URL, plantedToken)
		assertPullRequestsForCommit(t, ctx, f, "acme/infra", PullRequest{
			Number: 5, Title: "Scale workload-a to 4 workers", HeadSHA: "7638417db6d59f3c431d3e1f261cc637155684cd", HeadRef: "scale-workload-a-4",
			HeadFetchRef: "refs/pull/5/head", BaseRef: "main", URL: "https://github.com/acme/infra/pull/5",
			Merged: true, MergeCommitSHA: "e5bd3914e2e596debea16f433f57875b5b90bcd6",
			Author: "octo-operator", Association: AssociationMember,
		})
	})

	t.Run("the commit status carries state, context, description and link", func(t *testing.T) {
		g, srv := newGitHubContract(t, plantedToken)
		f := newTestGitHub(t, srv.URL, plantedToken)
		sha := "6dcb09b5b57875f334f61aebed695e2e4193db5e"
		long := strings.Repeat("stage workers waiting for MachineDeployment/workload-a ", 5)
		if err := f.SetCommitStatus(ctx, "acme/infra", sha, Status{State: StatePending, Description: long, TargetURL: "https://github.com/acme/infra/pull/7#issuecomment-1001"}); err != nil {
			t.Fatal(err)
		}
		if err := f.SetCommitStatus(ctx, "acme/infra", sha, Status{State: StateSuccess, Context: "capstan/workload-a", Description: "Ready"}); err != nil {
			t.Fatal(err)
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		sts := g.statuses[sha]
		if len(sts) != 2 {
			t.Fatalf("%d statuses, want 2", len(sts))
		}
		if sts[0]["state"] != "pending" || sts[0]["context"] != DefaultStatusContext || countRunes(sts[0]["description"].(string)) > MaxStatusDescription ||
			sts[0]["target_url"] != "https://github.com/acme/infra/pull/7#issuecomment-1001" {
			t.Errorf("first status = %v", sts[0])
		}
		if sts[1]["state"] != "success" || sts[1]["context"] != "capstan/workload-a" || sts[1]["description"] != "Ready" || sts[1]["target_url"] != nil {
			t.Errorf("second status = %v", sts[1])
		}
	})
}

// TestGitHubErrorsAgainstDocumentedContract pins what an operator reads
// when the token or the repository is wrong, and that the token is never
// part of it.
func TestGitHubErrorsAgainstDocumentedContract(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const known = "the-token-github-knows"
	_, srv := newGitHubContract(t, known)
	for _, tc := range []struct {
		name, token, repo string
		call              func(f Forge, repo string) error
		want              []string
	}{
		{"an unknown token names the forge, the pull request and the Secret", plantedToken, "acme/infra",
			func(f Forge, repo string) error { _, err := f.UpsertComment(ctx, repo, 7, "plan", "x"); return err },
			[]string{"github", "comment on pull request 7 of acme/infra", "401", "check that the Secret holds a valid"}},
		{"a repository the token cannot see names the repository and the base URL", known, "acme/other",
			func(f Forge, repo string) error { _, err := f.OpenPullRequests(ctx, repo, "main"); return err },
			[]string{"github", "list open pull requests against main of acme/other", "not found", srv.URL + "/api/v3", "Pull requests: read"}},
		{"a failed status names the commit", plantedToken, "acme/infra",
			func(f Forge, repo string) error {
				return f.SetCommitStatus(ctx, repo, "abc123", Status{State: StateSuccess})
			},
			[]string{"github", "set commit status capstan on commit abc123 of acme/infra"}},
		{"a forge that echoes the token", known, "echo/infra",
			func(f Forge, repo string) error { _, err := f.OpenPullRequests(ctx, repo, "main"); return err },
			[]string{"github", "502", "[redacted]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(newTestGitHub(t, srv.URL, tc.token), tc.repo)
			assertForgeError(t, err, tc.token, tc.want)
		})
	}
}

// assertForgeError checks an error's text and that token is not in it.
func assertForgeError(t *testing.T, err error, token string, want []string) {
	t.Helper()
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	if strings.Contains(msg, token) {
		t.Errorf("the token is in the error: %s", msg)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("error %q does not contain %q", msg, w)
		}
	}
}

// assertUpserts runs the upsert sequence every provider must follow: the
// first call creates the comment, a different body edits it, the same body
// leaves it alone; ours lists the bodies of the comments carrying the
// marker.
func assertUpserts(t *testing.T, ctx context.Context, f Forge, repo string, pr int64, ours func() []string) {
	t.Helper()
	first, err := f.UpsertComment(ctx, repo, pr, "plan", "**Plan** for revision main@sha1:aaa\n\n1 object changes")
	if err != nil {
		t.Fatal(err)
	}
	second, err := f.UpsertComment(ctx, repo, pr, "plan", "**Plan** for revision main@sha1:bbb\n\n2 objects change")
	if err != nil {
		t.Fatal(err)
	}
	third, err := f.UpsertComment(ctx, repo, pr, "plan", "**Plan** for revision main@sha1:bbb\n\n2 objects change")
	if err != nil {
		t.Fatal(err)
	}
	if first.Action != CommentCreated || second.Action != CommentEdited || third.Action != CommentUnchanged {
		t.Errorf("actions = %s, %s, %s; want created, edited, unchanged", first.Action, second.Action, third.Action)
	}
	if first.ID != second.ID || second.ID != third.ID || first.URL == "" {
		t.Errorf("comments = %+v, %+v, %+v; want one comment with a URL", first, second, third)
	}
	bodies := ours()
	want := Marker("plan") + "\n**Plan** for revision main@sha1:bbb\n\n2 objects change"
	if len(bodies) != 1 || bodies[0] != want {
		t.Errorf("comments with the marker = %q, want exactly one: %q", bodies, want)
	}
}

// assertReadComment checks the read every provider must do, on a pull
// request that has no comment of Capstan's yet (others may be there, as
// many as fill a page): comments that quote the marker or carry the
// marker of another key (write adds them as a person would) are not it;
// once UpsertComment wrote one, it is read back as written.
func assertReadComment(t *testing.T, ctx context.Context, f Forge, repo string, pr int64, write func(body string)) {
	t.Helper()
	write("> " + Marker("plan") + "\n> quoted, not ours")
	write(Marker("planned") + "\n### Capstan plan of another key")
	if c, found, err := f.ReadComment(ctx, repo, pr, "plan"); err != nil || found {
		t.Fatalf("ReadComment before there is one = %+v, %v, %v; want none", c, found, err)
	}
	body := "### Capstan plan for #7\n\nRevision `refs/pull/7/head@sha1:bbb`.\n\n```diff\n+ replicas: 5\n```\n"
	up, err := f.UpsertComment(ctx, repo, pr, "plan", body)
	if err != nil {
		t.Fatal(err)
	}
	write(Marker("plan") + "\na second comment with the marker, written by hand")
	c, found, err := f.ReadComment(ctx, repo, pr, "plan")
	if err != nil || !found {
		t.Fatalf("ReadComment = %+v, %v, %v; want the comment UpsertComment made", c, found, err)
	}
	if c.ID != up.ID || c.URL != up.URL || c.Body != body || c.Action != "" {
		t.Errorf("ReadComment = %+v\nwant ID %d, URL %s, body %q", c, up.ID, up.URL, body)
	}
}

// assertPullRequestsForCommit checks the lookup every provider must do:
// the merge commit and the head of a merged pull request both lead to it,
// any other commit to none.
func assertPullRequestsForCommit(t *testing.T, ctx context.Context, f Forge, repo string, merged PullRequest) {
	t.Helper()
	for _, sha := range []string{merged.MergeCommitSHA, merged.HeadSHA} {
		prs, err := f.PullRequestsForCommit(ctx, repo, sha)
		if err != nil {
			t.Fatal(err)
		}
		if len(prs) != 1 || fmt.Sprint(prs[0]) != fmt.Sprint(merged) || !prs[0].CameFrom(sha) {
			t.Errorf("pull requests of commit %s:\n got %+v\nwant %+v", sha, prs, merged)
		}
	}
	prs, err := f.PullRequestsForCommit(ctx, repo, "0000000000000000000000000000000000000001")
	if err != nil || len(prs) != 0 {
		t.Errorf("pull requests of a commit of none = %+v, %v; want none", prs, err)
	}
}
