package git

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/sources"
)

// inRepo runs git in the bare repository repo of the test server, as a
// person with push access would (tagging, moving refs), and returns its
// trimmed output.
func inRepo(t testing.TB, repo string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Env = append(os.Environ(), "GIT_DIR="+server.RepoPath(repo), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=Capstan Test", "GIT_AUTHOR_EMAIL=test@capstan.dev",
		"GIT_COMMITTER_NAME=Capstan Test", "GIT_COMMITTER_EMAIL=test@capstan.dev")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// tag tags commit in repo: an annotated tag when annotated is set.
func tag(t *testing.T, repo, name, commit string, annotated bool) {
	t.Helper()
	if annotated {
		inRepo(t, repo, "tag", "-a", "-m", "release "+name, name, commit)
		return
	}
	inRepo(t, repo, "tag", name, commit)
}

// commitFile commits one file to branch of repo and returns the commit.
func commitFile(t *testing.T, repo, branch, path, content string) string {
	t.Helper()
	h, err := server.Commit(repo, branch, map[string]string{path: content}, "set "+path)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// refSource is an http Source of repo that follows ref.
func refSource(t *testing.T, repo string, ref Ref) *Source {
	t.Helper()
	return httpSource(t, repo, func(o *Options) { o.Ref = ref })
}

// wantRevision checks Revision, then Fetch: the same revision, and the
// content of the commit it names.
func wantRevision(t *testing.T, src *Source, want, file, content string) {
	t.Helper()
	ctx := testContext(t)
	rev, err := src.Revision(ctx)
	if err != nil || rev != want {
		t.Fatalf("Revision = %q, %v; want %q", rev, err, want)
	}
	art, err := src.Fetch(ctx)
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	if art.Revision != want {
		t.Errorf("Artifact.Revision = %q, want %q", art.Revision, want)
	}
	if got := readAll(t, art.FS)[file]; got != content {
		t.Errorf("%s = %q, want %q", file, got, content)
	}
}

func TestTagRefFollowsTheTagNotTheBranch(t *testing.T) {
	for _, annotated := range []bool{false, true} {
		name := map[bool]string{false: "lightweight", true: "annotated"}[annotated]
		t.Run(name, func(t *testing.T) {
			repo, _ := newRepo(t, clusterFiles)
			v1 := commitFile(t, repo, "main", "version", "1")
			tag(t, repo, "v1.0.0", v1, annotated)
			src := refSource(t, repo, Ref{Tag: "v1.0.0"})
			// An annotated tag's revision names the commit, not the tag
			// object.
			wantRevision(t, src, "v1.0.0@sha1:"+v1, "version", "1")

			commitFile(t, repo, "main", "version", "2")
			wantRevision(t, src, "v1.0.0@sha1:"+v1, "version", "1")

			// A tag moved on purpose (git tag -f) is followed.
			v1b := commitFile(t, repo, "main", "version", "1b")
			inRepo(t, repo, "tag", "-d", "v1.0.0")
			tag(t, repo, "v1.0.0", v1b, annotated)
			wantRevision(t, src, "v1.0.0@sha1:"+v1b, "version", "1b")
		})
	}
}

func TestSemverRangeFollowsTheHighestMatchingTag(t *testing.T) {
	repo, _ := newRepo(t, clusterFiles)
	v100 := commitFile(t, repo, "main", "version", "1.0.0")
	tag(t, repo, "v1.0.0", v100, false)
	v120 := commitFile(t, repo, "main", "version", "1.2.0")
	tag(t, repo, "v1.2.0", v120, true)
	tag(t, repo, "latest", v120, false)
	v2 := commitFile(t, repo, "main", "version", "2.0.0")
	tag(t, repo, "v2.0.0", v2, false)
	tag(t, repo, "v1.9.0-rc.1", v2, false) // a pre-release: outside a plain range
	src := refSource(t, repo, Ref{SemVer: ">=1.0.0 <2.0.0"})
	wantRevision(t, src, "v1.2.0@sha1:"+v120, "version", "1.2.0")

	// A new matching tag rolls out; a tag outside the range does not.
	v130 := commitFile(t, repo, "main", "version", "1.3.0")
	tag(t, repo, "v1.3.0", v130, true)
	wantRevision(t, src, "v1.3.0@sha1:"+v130, "version", "1.3.0")
	v3 := commitFile(t, repo, "main", "version", "3.0.0")
	tag(t, repo, "v3.0.0", v3, false)
	tag(t, repo, "not-a-version", v3, false)
	wantRevision(t, src, "v1.3.0@sha1:"+v130, "version", "1.3.0")
}

func TestPinnedCommitNeverMoves(t *testing.T) {
	tests := []struct {
		name string
		// shaInWant lets the server hand out any reachable commit by its
		// SHA, as GitHub, GitLab and Gitea do.
		shaInWant bool
		// fetchRequests is what the first Fetch costs over http.
		fetchRequests int64
	}{
		{name: "the server serves a commit by its SHA: one shallow fetch", shaInWant: true, fetchRequests: 2},
		{name: "the server serves only its refs: a full fetch of branches and tags", shaInWant: false, fetchRequests: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			repo, _ := newRepo(t, clusterFiles)
			if tt.shaInWant {
				inRepo(t, repo, "config", "uploadpack.allowReachableSHA1InWant", "true")
			}
			pinned := commitFile(t, repo, "main", "version", "pinned")
			commitFile(t, repo, "main", "version", "later") // the pin is no tip
			src := refSource(t, repo, Ref{Commit: pinned})

			before := server.Requests()
			wantRevision(t, src, "sha1:"+pinned, "version", "pinned")
			if got := server.Requests() - before; got != tt.fetchRequests {
				t.Errorf("Revision and the first Fetch made %d HTTP requests, want %d (log %v)", got, tt.fetchRequests, server.RequestLog())
			}

			commitFile(t, repo, "main", "version", "even later")
			before = server.Requests()
			for range 3 {
				if rev, err := src.Revision(ctx); err != nil || rev != "sha1:"+pinned {
					t.Fatalf("Revision after the branch moved = %q, %v; want sha1:%s", rev, err, pinned)
				}
			}
			if got := server.Requests() - before; got != 0 {
				t.Errorf("polls of a pinned commit made %d requests, want none", got)
			}
		})
	}
}

func TestNameFollowsAPullRequestRef(t *testing.T) {
	repo, _ := newRepo(t, clusterFiles)
	// The head of a pull request: a commit no branch of the repository
	// holds, only refs/pull/7/head, as forges keep them.
	head := commitFile(t, repo, "pr-7", "version", "pr")
	inRepo(t, repo, "update-ref", "refs/pull/7/head", head)
	inRepo(t, repo, "update-ref", "-d", "refs/heads/pr-7")
	src := refSource(t, repo, Ref{Name: "refs/pull/7/head"})
	wantRevision(t, src, "refs/pull/7/head@sha1:"+head, "version", "pr")

	next := commitFile(t, repo, "pr-7", "version", "pr, second push")
	inRepo(t, repo, "update-ref", "refs/pull/7/head", next)
	wantRevision(t, src, "refs/pull/7/head@sha1:"+next, "version", "pr, second push")
}

func TestUnchangedPollCostsOneRequestForEveryRefKind(t *testing.T) {
	repo, _ := newRepo(t, clusterFiles)
	head := commitFile(t, repo, "main", "version", "1")
	tag(t, repo, "v1.0.0", head, true)
	tag(t, repo, "v1.1.0", head, false)
	inRepo(t, repo, "update-ref", "refs/pull/7/head", head)
	infoRefs := "/" + repo + ".git/info/refs"
	uploadPack := "/" + repo + ".git/git-upload-pack"

	tests := []struct {
		name     string
		ref      Ref
		requests int64 // per poll
	}{
		{name: "branch", ref: Ref{Branch: "main"}, requests: 1},
		{name: "tag", ref: Ref{Tag: "v1.0.0"}, requests: 1},
		{name: "semver", ref: Ref{SemVer: "^1"}, requests: 1},
		{name: "name", ref: Ref{Name: "refs/pull/7/head"}, requests: 1},
		{name: "commit", ref: Ref{Commit: head}, requests: 0},
	}
	const polls = 3
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			src := refSource(t, repo, tt.ref)
			total, refs, packs := server.Requests(), server.RequestsTo(infoRefs), server.RequestsTo(uploadPack)
			for range polls {
				if _, err := src.Revision(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if got := server.Requests() - total; got != polls*tt.requests {
				t.Errorf("%d polls made %d HTTP requests, want %d", polls, got, polls*tt.requests)
			}
			if got := server.RequestsTo(infoRefs) - refs; got != polls*tt.requests {
				t.Errorf("%d polls made %d requests to info/refs, want %d", polls, got, polls*tt.requests)
			}
			if got := server.RequestsTo(uploadPack) - packs; got != 0 {
				t.Errorf("polls made %d upload-pack requests, want none", got)
			}
		})
	}
}

func TestBadRefsAreRefusedNamingTheField(t *testing.T) {
	tests := []struct {
		name string
		ref  Ref
		want string
	}{
		{name: "two refs", ref: Ref{Branch: "main", Tag: "v1"}, want: "set only one of ref.branch, ref.tag, ref.semver, ref.commit and ref.name"},
		{name: "a malformed semver range", ref: Ref{SemVer: ">=one"}, want: `ref.semver ">=one" is not a semver range`},
		{name: "a short SHA", ref: Ref{Commit: "4f2c9a1"}, want: `ref.commit "4f2c9a1" is not a full commit SHA`},
		{name: "an upper-case SHA", ref: Ref{Commit: strings.Repeat("AB", 20)}, want: "ref.commit"},
		{name: "a full ref as a tag", ref: Ref{Tag: "refs/tags/v1"}, want: "ref.tag \"refs/tags/v1\" must be a plain tag name"},
		{name: "a tag git would refuse", ref: Ref{Tag: "v1..2"}, want: "ref.tag"},
		{name: "a short name", ref: Ref{Name: "pull/7/head"}, want: `ref.name "pull/7/head" must be a full ref name`},
		{name: "a full ref as a branch", ref: Ref{Branch: "refs/heads/main"}, want: "plain branch name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(Options{URL: "https://git.example.com/infra.git", Ref: tt.ref})
			if !errors.Is(err, sources.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New = %v, want sources.ErrInvalid saying %q", err, tt.want)
			}
		})
	}
}

func TestMissingRefsAreNotFoundNamingTheField(t *testing.T) {
	repo, head := newRepo(t, clusterFiles)
	tag(t, repo, "v1.0.0", head, false)
	tag(t, repo, "v2.0.0", head, true)
	missing := strings.Repeat("0123456789", 4)
	tests := []struct {
		name string
		ref  Ref
		// revision and fetch are what the errors of Revision and Fetch
		// must say; "" when the call must succeed.
		revision, fetch string
	}{
		{name: "a tag that does not exist", ref: Ref{Tag: "v9.9.9"},
			revision: "tag v9.9.9 does not exist on the remote: check spec.source.git.ref.tag or push it (it has v1.0.0, v2.0.0)",
			fetch:    "tag v9.9.9 does not exist on the remote: check spec.source.git.ref.tag"},
		{name: "a range no tag matches", ref: Ref{SemVer: ">=3.0.0"},
			revision: `no tag is a semantic version within ">=3.0.0" (the repository has 2 tags): push one or change spec.source.git.ref.semver`,
			fetch:    `no tag is a semantic version within ">=3.0.0"`},
		{name: "a ref that does not exist", ref: Ref{Name: "refs/pull/9/head"},
			revision: "ref refs/pull/9/head does not exist on the remote: check spec.source.git.ref.name",
			fetch:    "ref refs/pull/9/head does not exist on the remote: check spec.source.git.ref.name"},
		{name: "a commit that does not exist", ref: Ref{Commit: missing},
			fetch: "commit " + missing + " is not in the repository (or no branch or tag reaches it): check spec.source.git.ref.commit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			src := refSource(t, repo, tt.ref)
			_, revErr := src.Revision(ctx)
			_, fetchErr := src.Fetch(ctx)
			for op, c := range map[string]struct {
				err  error
				want string
			}{"Revision": {revErr, tt.revision}, "Fetch": {fetchErr, tt.fetch}} {
				if c.want == "" {
					if c.err != nil {
						t.Errorf("%s = %v, want no error", op, c.err)
					}
					continue
				}
				if !errors.Is(c.err, sources.ErrNotFound) || !strings.Contains(c.err.Error(), c.want) {
					t.Errorf("%s = %v, want sources.ErrNotFound saying %q", op, c.err, c.want)
				}
				if c.err != nil && !strings.Contains(c.err.Error(), server.HTTPURL(repo)) {
					t.Errorf("%s error %q does not name the repository", op, c.err)
				}
			}
		})
	}

	// A server that hands out commits by SHA answers a missing one with
	// "not our ref"; the error is the same.
	t.Run("a commit that does not exist, asked by SHA", func(t *testing.T) {
		repo, _ := newRepo(t, clusterFiles)
		inRepo(t, repo, "config", "uploadpack.allowReachableSHA1InWant", "true")
		_, err := refSource(t, repo, Ref{Commit: missing}).Fetch(testContext(t))
		if !errors.Is(err, sources.ErrNotFound) || !strings.Contains(err.Error(), "check spec.source.git.ref.commit") {
			t.Errorf("Fetch = %v, want sources.ErrNotFound naming spec.source.git.ref.commit", err)
		}
	})
}

func TestRefKindsOverGitDaemonAndFile(t *testing.T) {
	repo, _ := newRepo(t, clusterFiles)
	v1 := commitFile(t, repo, "main", "version", "1")
	tag(t, repo, "v1.0.0", v1, true)
	inRepo(t, repo, "update-ref", "refs/pull/7/head", v1)
	commitFile(t, repo, "main", "version", "2")
	refs := map[string]struct {
		ref  Ref
		want string
	}{
		"tag":    {Ref{Tag: "v1.0.0"}, "v1.0.0@sha1:" + v1},
		"semver": {Ref{SemVer: "1.x"}, "v1.0.0@sha1:" + v1},
		"commit": {Ref{Commit: v1}, "sha1:" + v1},
		"name":   {Ref{Name: "refs/pull/7/head"}, "refs/pull/7/head@sha1:" + v1},
	}
	for scheme, url := range map[string]string{"git": server.GitURL(repo), "file": server.FileURL(repo)} {
		for kind, r := range refs {
			t.Run(scheme+"/"+kind, func(t *testing.T) {
				src, err := New(Options{URL: url, Ref: r.ref})
				if err != nil {
					t.Fatal(err)
				}
				wantRevision(t, src, r.want, "version", "1")
			})
		}
	}
}
