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

// gitlabProject is the project the GitLab fake serves, in a subgroup.
const gitlabProject = "acme/platform/infra"

// gitlabContract is a fake of the GitLab REST API v4 that implements only
// the documented endpoints the GitLab provider calls, for the project
// acme/platform/infra and its merge requests 3 and 5.
type gitlabContract struct {
	t     *testing.T
	token string

	mu       sync.Mutex
	nextID   int64
	notes    map[int64][]map[string]any // by merge request iid, oldest first
	statuses map[string]map[string]any  // by sha and name: the latest
	posts    []map[string]any           // every status posted
	// memberLookups counts the lookups of each user's membership.
	memberLookups map[string]int
}

func newGitLabContract(t *testing.T, token string) (*gitlabContract, *httptest.Server) {
	g := &gitlabContract{t: t, token: token, nextID: 5000,
		notes: map[int64][]map[string]any{3: nil, 5: nil}, statuses: map[string]map[string]any{},
		memberLookups: map[string]int{}}
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	return g, srv
}

func (g *gitlabContract) addNote(mr int64, username, body string, system bool) map[string]any {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.addNoteLocked(mr, username, body, system)
}

func (g *gitlabContract) addNoteLocked(mr int64, username, body string, system bool) map[string]any {
	g.nextID++
	name := "gitlab/note.json"
	if system {
		name = "gitlab/system_note.json"
	}
	n := loadObject(g.t, name)
	n["id"] = g.nextID
	n["body"] = body
	n["noteable_iid"] = mr
	n["author"].(map[string]any)["username"] = username
	g.notes[mr] = append(g.notes[mr], n)
	return n
}

func (g *gitlabContract) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("PRIVATE-TOKEN") != g.token {
		writeJSON(w, http.StatusUnauthorized, loadJSON(g.t, "gitlab/error-unauthorized.json"))
		return
	}
	// The project is one URL-encoded path segment.
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), "/api/v4/projects/acme%2Fplatform%2Finfra/")
	if !ok {
		writeJSON(w, http.StatusNotFound, loadJSON(g.t, "gitlab/error-project-not-found.json"))
		return
	}
	parts := strings.Split(rest, "/")
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case r.Method == http.MethodGet && rest == "merge_requests":
		g.listMergeRequests(w, r)
	case len(parts) >= 3 && parts[0] == "merge_requests" && parts[2] == "notes":
		iid, _ := strconv.ParseInt(parts[1], 10, 64)
		if _, ok := g.notes[iid]; !ok {
			writeJSON(w, http.StatusNotFound, map[string]any{"message": "404 Not found"})
			return
		}
		switch {
		case r.Method == http.MethodGet && len(parts) == 3:
			if r.URL.Query().Get("sort") != "asc" {
				g.t.Errorf("notes listed with sort=%q: GitLab's default is newest first, the provider asks for oldest first", r.URL.Query().Get("sort"))
			}
			items, next, link := page(r, g.notes[iid], 20, 100)
			gitlabPageHeaders(w, r, next, len(g.notes[iid]), link)
			writeJSON(w, http.StatusOK, items)
		case r.Method == http.MethodPost && len(parts) == 3:
			if body, ok := g.noteBody(w, r); ok {
				writeJSON(w, http.StatusCreated, g.addNoteLocked(iid, "capstan-bot", body, false))
			}
		case r.Method == http.MethodPut && len(parts) == 4:
			id, _ := strconv.ParseInt(parts[3], 10, 64)
			for _, n := range g.notes[iid] {
				if jsonID(n["id"]) == id {
					if body, ok := g.noteBody(w, r); ok {
						n["body"] = body
						writeJSON(w, http.StatusOK, n)
					}
					return
				}
			}
			writeJSON(w, http.StatusNotFound, map[string]any{"message": "404 Not found"})
		default:
			w.WriteHeader(http.StatusMethodNotAllowed)
		}
	case r.Method == http.MethodPost && len(parts) == 2 && parts[0] == "statuses":
		g.setStatus(w, r, parts[1])
	case r.Method == http.MethodGet && len(parts) == 3 && parts[0] == "members" && parts[1] == "all":
		// Members of the project, inherited ones included: maint (503) is
		// a Maintainer, reviewer (504) a Reporter, anyone else none.
		g.memberLookups[parts[2]]++
		levels := map[string]int{"503": 40, "504": 20}
		level, ok := levels[parts[2]]
		if !ok {
			writeJSON(w, http.StatusNotFound, map[string]any{"message": "404 Not found"})
			return
		}
		m := loadObject(g.t, "gitlab/project_member.json")
		id, _ := strconv.Atoi(parts[2])
		m["id"], m["access_level"] = id, level
		writeJSON(w, http.StatusOK, m)
	case r.Method == http.MethodGet && len(parts) == 4 && parts[0] == "repository" && parts[1] == "commits" && parts[3] == "merge_requests":
		out := []any{}
		for _, mr := range loadJSON(g.t, "gitlab/commit_merge_requests.json").([]any) {
			m := mr.(map[string]any)
			if m["merge_commit_sha"] == parts[2] || m["sha"] == parts[2] {
				out = append(out, mr)
			}
		}
		writeJSON(w, http.StatusOK, out)
	default:
		writeJSON(w, http.StatusNotFound, map[string]any{"message": "404 Not found"})
	}
}

func gitlabPageHeaders(w http.ResponseWriter, r *http.Request, next, total int, link string) {
	w.Header().Set("Link", link)
	w.Header().Set("X-Total", strconv.Itoa(total))
	w.Header().Set("X-Page", r.URL.Query().Get("page"))
	if next != 0 {
		w.Header().Set("X-Next-Page", strconv.Itoa(next))
	} else {
		w.Header().Set("X-Next-Page", "")
	}
}

func (g *gitlabContract) listMergeRequests(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var out []any
	for _, mr := range loadJSON(g.t, "gitlab/merge_requests.json").([]any) {
		m := mr.(map[string]any)
		if s := q.Get("state"); s != "" && s != m["state"] {
			continue
		}
		if b := q.Get("target_branch"); b != "" && b != m["target_branch"] {
			continue
		}
		out = append(out, mr)
	}
	items, next, link := page(r, out, 20, 100)
	gitlabPageHeaders(w, r, next, len(out), link)
	writeJSON(w, http.StatusOK, items)
}

func (g *gitlabContract) noteBody(w http.ResponseWriter, r *http.Request) (string, bool) {
	var in struct {
		Body string `json:"body"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Body == "" {
		writeJSON(w, http.StatusBadRequest, map[string]any{"message": "400 Bad request - body is missing"})
		return "", false
	}
	if countRunes(in.Body) > 1_000_000 {
		writeJSON(w, http.StatusBadRequest, loadJSON(g.t, "gitlab/error-note-too-long.json"))
		return "", false
	}
	return in.Body, true
}

// gitlabEvents are the state machine events GitLab names in its refusal.
var gitlabEvents = map[string]string{"pending": "enqueue", "running": "run", "success": "success", "failed": "drop", "canceled": "cancel"}

func (g *gitlabContract) setStatus(w http.ResponseWriter, r *http.Request, sha string) {
	var in struct {
		State       string  `json:"state"`
		Name        *string `json:"name"`
		TargetURL   *string `json:"target_url"`
		Description *string `json:"description"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || gitlabEvents[in.State] == "" {
		writeJSON(w, http.StatusBadRequest, map[string]any{"message": "400 Bad request - state does not have a valid value"})
		return
	}
	name := "default"
	if in.Name != nil {
		name = *in.Name
	}
	key := sha + "/" + name
	if prev := g.statuses[key]; prev != nil && prev["status"] == in.State {
		writeJSON(w, http.StatusBadRequest, map[string]any{
			"message": fmt.Sprintf("Cannot transition status via :%s from :%s", gitlabEvents[in.State], in.State)})
		return
	}
	st := loadObject(g.t, "gitlab/commit_status.json")
	st["sha"], st["status"], st["name"] = sha, in.State, name
	if in.TargetURL != nil {
		st["target_url"] = *in.TargetURL
	}
	if in.Description != nil {
		st["description"] = *in.Description
	}
	g.statuses[key] = st
	g.posts = append(g.posts, st)
	writeJSON(w, http.StatusCreated, st)
}

func (g *gitlabContract) ourNotes(mr int64, key string) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, n := range g.notes[mr] {
		if b := n["body"].(string); strings.HasPrefix(b, Marker(key)) {
			out = append(out, b)
		}
	}
	return out
}

func newTestGitLab(t *testing.T, url, token string) *GitLab {
	t.Helper()
	f, err := NewGitLab(Config{BaseURL: url, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestGitLabAgainstDocumentedContract(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	t.Run("open merge requests into the branch are listed, forks included and said to be", func(t *testing.T) {
		g, srv := newGitLabContract(t, plantedToken)
		f := newTestGitLab(t, srv.URL, plantedToken)
		prs, err := f.OpenPullRequests(ctx, gitlabProject, "main")
		if err != nil {
			t.Fatal(err)
		}
		// A merge request from another project is a fork's. GitLab does
		// not say what its author is to the project: the provider asks
		// (members/all), for forks alone; a Maintainer is a trusted
		// member, a Reporter (who may not push) and a stranger are not.
		want := []PullRequest{
			{Number: 3, Title: "Scale workload-a to 5 workers", HeadSHA: "6dcb09b5b57875f334f61aebed695e2e4193db5e", HeadRef: "scale-workload-a",
				HeadFetchRef: "refs/merge-requests/3/head", BaseRef: "main", URL: "https://gitlab.example.com/acme/platform/infra/-/merge_requests/3",
				Author: "operator"},
			{Number: 5, Title: "Kubernetes v1.35.4 for workload-b", HeadSHA: "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678", HeadRef: "k8s-1.35",
				HeadFetchRef: "refs/merge-requests/5/head", BaseRef: "main", URL: "https://gitlab.example.com/acme/platform/infra/-/merge_requests/5",
				Fork: true, Author: "contractor"},
			{Number: 6, Title: "Rotate the etcd CA", HeadSHA: "2468024680246802468024680246802468024680", HeadRef: "etcd-ca",
				HeadFetchRef: "refs/merge-requests/6/head", BaseRef: "main", URL: "https://gitlab.example.com/acme/platform/infra/-/merge_requests/6",
				Fork: true, Author: "maint", Association: AssociationMember},
			{Number: 8, Title: "Drop the bastion", HeadSHA: "1357913579135791357913579135791357913579", HeadRef: "drop-bastion",
				HeadFetchRef: "refs/merge-requests/8/head", BaseRef: "main", URL: "https://gitlab.example.com/acme/platform/infra/-/merge_requests/8",
				Fork: true, Author: "reviewer"},
		}
		if fmt.Sprint(prs) != fmt.Sprint(want) {
			t.Errorf("open merge requests:\n got %+v\nwant %+v", prs, want)
		}
		// The answers are kept a while: listing again asks no more.
		if _, err := f.OpenPullRequests(ctx, gitlabProject, "main"); err != nil {
			t.Fatal(err)
		}
		g.mu.Lock()
		lookups := fmt.Sprint(g.memberLookups)
		g.mu.Unlock()
		if want := "map[502:1 503:1 504:1]"; lookups != want {
			t.Errorf("membership lookups by user ID = %s, want %s: once per fork author, none for a branch of the project", lookups, want)
		}
	})

	t.Run("one note is created, edited in place, then left alone, past system notes and a page of others", func(t *testing.T) {
		g, srv := newGitLabContract(t, plantedToken)
		g.addNote(3, "operator", "added 1 commit", true)
		for i := range 110 {
			g.addNote(3, "reviewer", fmt.Sprintf("note %d", i), false)
		}
		g.addNote(3, "reviewer", "> "+Marker("plan")+"\n> quoted, not ours", false)
		f := newTestGitLab(t, srv.URL, plantedToken)
		assertUpserts(t, ctx, f, gitlabProject, 3, func() []string { return g.ourNotes(3, "plan") })
		c, err := f.UpsertComment(ctx, gitlabProject, 3, "plan", "again")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(c.URL, srv.URL+"/acme/platform/infra/-/merge_requests/3#note_") {
			t.Errorf("note URL = %q, want the merge request's page with the note's anchor", c.URL)
		}
	})

	t.Run("the note is read back past system notes and a page of others, and no other is taken for it", func(t *testing.T) {
		g, srv := newGitLabContract(t, plantedToken)
		g.addNote(3, "capstan-bot", Marker("plan")+"\nGitLab never writes this, but a system note is not ours", true)
		for i := range 110 {
			g.addNote(3, "reviewer", fmt.Sprintf("note %d", i), false)
		}
		assertReadComment(t, ctx, newTestGitLab(t, srv.URL, plantedToken), gitlabProject, 3, func(body string) { g.addNote(3, "reviewer", body, false) })
	})

	t.Run("a merge commit and a merged head lead to their merge request; another commit to none", func(t *testing.T) {
		_, srv := newGitLabContract(t, plantedToken)
		assertPullRequestsForCommit(t, ctx, newTestGitLab(t, srv.URL, plantedToken), gitlabProject, PullRequest{
			Number: 2, Title: "Scale workload-a to 4 workers", HeadSHA: "7638417db6d59f3c431d3e1f261cc637155684cd", HeadRef: "scale-workload-a-4",
			HeadFetchRef: "refs/merge-requests/2/head", BaseRef: "main", URL: "https://gitlab.example.com/acme/platform/infra/-/merge_requests/2",
			Merged: true, MergeCommitSHA: "e5bd3914e2e596debea16f433f57875b5b90bcd6",
			Author: "operator",
		})
	})

	t.Run("the commit status maps states and repeats of the same state are accepted", func(t *testing.T) {
		g, srv := newGitLabContract(t, plantedToken)
		f := newTestGitLab(t, srv.URL, plantedToken)
		sha := "6dcb09b5b57875f334f61aebed695e2e4193db5e"
		for _, st := range []Status{
			{State: StatePending, Description: "stage workers: 1 of 3 machines", TargetURL: "https://gitlab.example.com/acme/platform/infra/-/merge_requests/3#note_5001"},
			{State: StatePending, Description: "stage workers: 2 of 3 machines"}, // GitLab refuses running -> running
			{State: StateFailure, Description: strings.Repeat("stuck ", 40)},
		} {
			if err := f.SetCommitStatus(ctx, gitlabProject, sha, st); err != nil {
				t.Fatalf("set %s: %v", st.State, err)
			}
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		if len(g.posts) != 2 {
			t.Fatalf("%d statuses stored, want 2 (running, failed)", len(g.posts))
		}
		if p := g.posts[0]; p["status"] != "running" || p["name"] != DefaultStatusContext || p["target_url"] == nil {
			t.Errorf("first status = %v, want running named capstan with a link", p)
		}
		if p := g.posts[1]; p["status"] != "failed" || countRunes(p["description"].(string)) > MaxStatusDescription {
			t.Errorf("second status = %v, want failed with a description cut to %d", p, MaxStatusDescription)
		}
	})
}

func TestGitLabErrorsAgainstDocumentedContract(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, srv := newGitLabContract(t, "the-token-gitlab-knows")
	unknown := newTestGitLab(t, srv.URL, plantedToken)
	known := newTestGitLab(t, srv.URL, "the-token-gitlab-knows")

	_, err := unknown.UpsertComment(ctx, gitlabProject, 3, "plan", "x")
	assertForgeError(t, err, plantedToken, []string{"gitlab", "comment on merge request 3 of acme/platform/infra", "401", "check that the Secret holds a valid"})

	_, err = known.OpenPullRequests(ctx, "acme/other", "main")
	assertForgeError(t, err, "the-token-gitlab-knows", []string{"gitlab", "list open merge requests against main of acme/other", "not found", srv.URL + "/api/v4", "Reporter role"})

	err = unknown.SetCommitStatus(ctx, gitlabProject, "abc123", Status{State: StateSuccess})
	assertForgeError(t, err, plantedToken, []string{"gitlab", "set commit status capstan on commit abc123 of acme/platform/infra"})
}
