package git

import (
	"errors"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/sources"
)

var clusterFiles = map[string]string{
	"clusters/mgmt-east/kustomization.yaml": "resources: [cluster.yaml]\n",
	"clusters/mgmt-east/cluster.yaml":       "kind: Cluster\nmetadata: {name: mgmt-east}\n",
	"README.md":                             "# infra\n",
}

func TestRevisionAndFetchOverHTTP(t *testing.T) {
	ctx := testContext(t)
	repo, hash := newRepo(t, clusterFiles)
	src := httpSource(t, repo)

	rev, err := src.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := "main@sha1:" + hash; rev != want {
		t.Errorf("Revision = %q, want %q", rev, want)
	}
	art, err := src.Fetch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if art.Revision != rev {
		t.Errorf("Artifact.Revision = %q, want %q", art.Revision, rev)
	}
	assertFiles(t, art.FS, clusterFiles)
	var size int64
	for _, c := range clusterFiles {
		size += int64(len(c))
	}
	if art.Size != size {
		t.Errorf("Artifact.Size = %d, want %d", art.Size, size)
	}
}

func TestNewCommitMovesRevisionAndContent(t *testing.T) {
	ctx := testContext(t)
	repo, first := newRepo(t, clusterFiles)
	src := httpSource(t, repo)
	if rev, err := src.Revision(ctx); err != nil || rev != "main@sha1:"+first {
		t.Fatalf("Revision = %q, %v; want main@sha1:%s", rev, err, first)
	}
	second, err := server.Commit(repo, "main", map[string]string{
		"clusters/mgmt-east/cluster.yaml": "kind: Cluster\nmetadata: {name: mgmt-east}\nspec: {paused: true}\n",
		"README.md":                       gitserver.Deleted,
	}, "pause mgmt-east")
	if err != nil {
		t.Fatal(err)
	}
	rev, err := src.Revision(ctx)
	if err != nil || rev != "main@sha1:"+second {
		t.Fatalf("Revision after commit = %q, %v; want main@sha1:%s", rev, err, second)
	}
	art, err := src.Fetch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if art.Revision != rev {
		t.Errorf("Artifact.Revision = %q, want %q", art.Revision, rev)
	}
	assertFiles(t, art.FS, map[string]string{
		"clusters/mgmt-east/kustomization.yaml": "resources: [cluster.yaml]\n",
		"clusters/mgmt-east/cluster.yaml":       "kind: Cluster\nmetadata: {name: mgmt-east}\nspec: {paused: true}\n",
	})
}

func TestUnchangedRemoteCostsOneRequestPerPoll(t *testing.T) {
	ctx := testContext(t)
	repo, _ := newRepo(t, clusterFiles)
	src := httpSource(t, repo)
	infoRefs := "/" + repo + ".git/info/refs"
	uploadPack := "/" + repo + ".git/git-upload-pack"

	const polls = 3
	total, refs := server.Requests(), server.RequestsTo(infoRefs)
	for range polls {
		if _, err := src.Revision(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := server.Requests() - total; got != polls {
		t.Errorf("%d polls made %d HTTP requests, want %d (log %v)", polls, got, polls, server.RequestLog())
	}
	if got := server.RequestsTo(infoRefs) - refs; got != polls {
		t.Errorf("%d polls made %d requests to info/refs, want %d", polls, got, polls)
	}
	if got := server.RequestsTo(uploadPack); got != 0 {
		t.Errorf("polls made %d upload-pack requests, want none: Revision must not download objects", got)
	}

	// A fetch is the ref advertisement plus one upload-pack exchange.
	total = server.Requests()
	if _, err := src.Fetch(ctx); err != nil {
		t.Fatal(err)
	}
	if got := server.Requests() - total; got != 2 {
		t.Errorf("Fetch made %d HTTP requests, want 2 (log %v)", got, server.RequestLog())
	}
}

func TestAuthErrorsNameTheFixAndHideThePassword(t *testing.T) {
	repo, _ := newRepo(t, clusterFiles)
	tests := []struct {
		name     string
		auth     Auth
		wantHint string
	}{
		{name: "wrong password", auth: Auth{Username: testUser, Password: "wrong-password-1234"}, wantHint: "refused the credentials"},
		{name: "wrong user", auth: Auth{Username: "mallory", Password: testPassword}, wantHint: "refused the credentials"},
		{name: "no credentials", wantHint: "requires credentials: set username and password (or a token) in spec.source.git.secretRef"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			src := httpSource(t, repo, func(o *Options) { o.Auth = tt.auth })
			_, revErr := src.Revision(ctx)
			_, fetchErr := src.Fetch(ctx)
			for op, err := range map[string]error{"Revision": revErr, "Fetch": fetchErr} {
				if err == nil {
					t.Fatalf("%s succeeded, want an authentication error", op)
				}
				msg := err.Error()
				if !errors.Is(err, sources.ErrAuth) || !sources.IsStalled(err) {
					t.Errorf("%s error %q does not wrap sources.ErrAuth", op, msg)
				}
				if !strings.Contains(msg, tt.wantHint) || !strings.Contains(msg, server.HTTPURL(repo)) {
					t.Errorf("%s error %q lacks %q or the URL", op, msg, tt.wantHint)
				}
				for _, secret := range []string{testPassword, tt.auth.Password} {
					if secret != "" && strings.Contains(msg, secret) {
						t.Errorf("%s error %q shows a password", op, msg)
					}
				}
			}
		})
	}
}

func TestMissingBranchAndRepository(t *testing.T) {
	repo, _ := newRepo(t, clusterFiles)
	if _, err := server.Commit(repo, "staging", map[string]string{"x": "x"}, "staging"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		url    string
		branch string
		want   []string
	}{
		{name: "missing branch", url: server.HTTPURL(repo), branch: "release-9",
			want: []string{"branch release-9 does not exist", server.HTTPURL(repo), "main, staging"}},
		{name: "missing repository", url: server.HTTPURL("no-such-repo"), branch: "main",
			want: []string{"repository not found", server.HTTPURL("no-such-repo")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			src := httpSource(t, repo, func(o *Options) { o.URL, o.Branch = tt.url, tt.branch })
			_, revErr := src.Revision(ctx)
			_, fetchErr := src.Fetch(ctx)
			for op, err := range map[string]error{"Revision": revErr, "Fetch": fetchErr} {
				if !errors.Is(err, sources.ErrNotFound) {
					t.Fatalf("%s = %v, want sources.ErrNotFound", op, err)
				}
				for _, w := range tt.want {
					if op == "Fetch" && w == "main, staging" {
						continue // only ls-remote sees the other branches
					}
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s error %q lacks %q", op, err, w)
					}
				}
			}
		})
	}
}

func TestEmptyRepositoryIsNotFound(t *testing.T) {
	ctx := testContext(t)
	if _, err := server.CreateRepo("empty"); err != nil {
		t.Fatal(err)
	}
	_, err := httpSource(t, "empty").Revision(ctx)
	if !errors.Is(err, sources.ErrNotFound) {
		t.Fatalf("Revision of an empty repository = %v, want sources.ErrNotFound", err)
	}
}

func TestFetchOverGitDaemonAndFile(t *testing.T) {
	repo, hash := newRepo(t, clusterFiles)
	for scheme, url := range map[string]string{"git": server.GitURL(repo), "file": server.FileURL(repo)} {
		t.Run(scheme, func(t *testing.T) {
			ctx := testContext(t)
			src, err := New(Options{URL: url})
			if err != nil {
				t.Fatal(err)
			}
			rev, err := src.Revision(ctx)
			if err != nil || rev != "main@sha1:"+hash {
				t.Fatalf("Revision = %q, %v; want main@sha1:%s", rev, err, hash)
			}
			art, err := src.Fetch(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if art.Revision != rev {
				t.Errorf("Artifact.Revision = %q, want %q", art.Revision, rev)
			}
			assertFiles(t, art.FS, clusterFiles)
		})
	}
}

func TestLimitsRefuseLargeContent(t *testing.T) {
	big := strings.Repeat("x", 2048)
	tests := []struct {
		name   string
		files  map[string]string
		limits sources.Limits
		want   string
	}{
		{name: "one file over the per-file limit", files: map[string]string{"big.yaml": big, "ok.yaml": "ok"},
			limits: sources.Limits{MaxFileBytes: 1024}, want: "over the limit of 1024 bytes per file"},
		{name: "files over the total limit", files: map[string]string{"a": big, "b": big + "y"},
			limits: sources.Limits{MaxTotalBytes: 3000}, want: "over the limit of 3000 bytes in total"},
		{name: "too many files", files: map[string]string{"a": "1", "b": "2", "c": "3"},
			limits: sources.Limits{MaxFiles: 2}, want: "limit of 2 files"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			repo, _ := newRepo(t, tt.files)
			_, err := httpSource(t, repo, func(o *Options) { o.Limits = tt.limits }).Fetch(ctx)
			if !errors.Is(err, sources.ErrRefused) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Fetch = %v, want sources.ErrRefused saying %q", err, tt.want)
			}
		})
	}
}
