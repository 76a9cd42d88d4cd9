package oci

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/capstan-dev/capstan/sources"
)

func testContext(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// overlay is a small kustomize overlay, as a directory would hold it.
func overlay(replicas int) fstest.MapFS {
	return fstest.MapFS{
		"clusters/east/kustomization.yaml": {Data: []byte("resources: [cm.yaml]\n"), Mode: 0o644},
		"clusters/east/cm.yaml": {Data: []byte(fmt.Sprintf(
			"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: east, namespace: default}\ndata: {replicas: %q}\n", fmt.Sprint(replicas))), Mode: 0o644},
		"scripts/run.sh": {Data: []byte("#!/bin/sh\n"), Mode: 0o755},
	}
}

func push(t testing.TB, ctx context.Context, url, tag string, fsys fs.FS) string {
	t.Helper()
	rev, err := Push(ctx, url, fsys, PushOptions{Tag: tag})
	if err != nil {
		t.Fatalf("Push(%s:%s): %v", url, tag, err)
	}
	return rev
}

func newSource(t testing.TB, opts Options) *Source {
	t.Helper()
	s, err := New(opts)
	if err != nil {
		t.Fatalf("New(%+v): %v", opts.Ref, err)
	}
	return s
}

// sameFiles fails t unless got holds exactly the regular files of want,
// with the same bytes and permissions.
func sameFiles(t *testing.T, got fs.FS, want fs.FS) {
	t.Helper()
	seen := map[string]bool{}
	err := fs.WalkDir(want, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		seen[p] = true
		wdata, _ := fs.ReadFile(want, p)
		gdata, err := fs.ReadFile(got, p)
		if err != nil {
			t.Errorf("artifact lacks %s: %v", p, err)
			return nil
		}
		if string(gdata) != string(wdata) {
			t.Errorf("%s = %q, want %q", p, gdata, wdata)
		}
		winfo, _ := d.Info()
		if ginfo, err := fs.Stat(got, p); err == nil && ginfo.Mode().Perm() != winfo.Mode().Perm() {
			t.Errorf("%s mode = %v, want %v", p, ginfo.Mode().Perm(), winfo.Mode().Perm())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = fs.WalkDir(got, ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && !seen[p] {
			t.Errorf("artifact holds %s, which the pushed directory does not", p)
		}
		return err
	})
}

func TestFetchFluxArtifact(t *testing.T) {
	ctx := testContext(t)
	reg := newTestRegistry(t, "", "")
	url := reg.URL("clusters/east")
	pushed := push(t, ctx, url, "v1", overlay(1))

	s := newSource(t, Options{URL: url, Ref: Ref{Tag: "v1"}})
	rev, err := s.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rev != pushed || !strings.HasPrefix(rev, "v1@sha256:") {
		t.Errorf("Revision = %q, want %q (tag@sha256:<digest>)", rev, pushed)
	}
	art, err := s.Fetch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if art.Revision != pushed {
		t.Errorf("Fetch revision = %q, want %q", art.Revision, pushed)
	}
	sameFiles(t, art.FS, overlay(1))
	if err := fstest.TestFS(art.FS, "clusters/east/kustomization.yaml", "scripts/run.sh"); err != nil {
		t.Error(err)
	}

	// The same content pushed again is the same manifest: no new revision.
	if again := push(t, ctx, url, "v1", overlay(1)); again != pushed {
		t.Errorf("pushing the same content again gave %q, want the same revision %q", again, pushed)
	}
}

// An unchanged poll must cost one HEAD request: no ping, no token, no
// manifest or blob download.
func TestRevisionUnchangedIsOneHEAD(t *testing.T) {
	ctx := testContext(t)
	reg := newTestRegistry(t, "", "")
	url := reg.URL("clusters/east")
	push(t, ctx, url, "latest", overlay(1))
	s := newSource(t, Options{URL: url})
	if _, err := s.Fetch(ctx); err != nil {
		t.Fatal(err)
	}
	reg.take()
	for i := range 3 {
		if _, err := s.Revision(ctx); err != nil {
			t.Fatal(err)
		}
		if got := reg.take(); !sameRequests(got, []string{"HEAD manifests"}) {
			t.Errorf("poll %d made requests %v, want exactly [HEAD manifests]", i, got)
		}
	}
}

func TestSemverFollowsHighestMatchingTag(t *testing.T) {
	ctx := testContext(t)
	reg := newTestRegistry(t, "", "")
	url := reg.URL("clusters/east")
	for i, tag := range []string{"1.0.0", "v1.1.0", "not-a-version", "2.0.0", "1.3.0-rc.1"} {
		push(t, ctx, url, tag, overlay(i))
	}
	s := newSource(t, Options{URL: url, Ref: Ref{SemVer: ">=1.0.0 <2.0.0"}})
	art, err := s.Fetch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(art.Revision, "v1.1.0@sha256:") {
		t.Fatalf("Fetch revision = %q, want v1.1.0@sha256:...", art.Revision)
	}
	sameFiles(t, art.FS, overlay(1))

	// An unchanged poll lists the tags and HEADs the chosen one, nothing more.
	reg.take()
	rev, err := s.Revision(ctx)
	if err != nil || rev != art.Revision {
		t.Fatalf("Revision = %q, %v; want %q", rev, err, art.Revision)
	}
	if got := reg.take(); !sameRequests(got, []string{"GET tags", "HEAD manifests"}) {
		t.Errorf("unchanged semver poll made %v, want [GET tags, HEAD manifests]", got)
	}

	// A new tag within the range moves the revision; one outside does not.
	push(t, ctx, url, "3.0.0", overlay(3))
	if rev, _ := s.Revision(ctx); rev != art.Revision {
		t.Errorf("after pushing 3.0.0, Revision = %q, want it unchanged %q", rev, art.Revision)
	}
	pushed := push(t, ctx, url, "1.2.0", overlay(7))
	rev, err = s.Revision(ctx)
	if err != nil || rev != pushed {
		t.Fatalf("after pushing 1.2.0, Revision = %q, %v; want %q", rev, err, pushed)
	}
	reg.take()
	art, err = s.Fetch(ctx)
	if err != nil || art.Revision != pushed {
		t.Fatalf("Fetch = %v, %v; want revision %q", art, err, pushed)
	}
	sameFiles(t, art.FS, overlay(7))
	if got := reg.take(); count(got, "GET blobs") != 1 {
		t.Errorf("Fetch made %v, want exactly one blob download", got)
	}

	none := newSource(t, Options{URL: url, Ref: Ref{SemVer: ">=5"}})
	if _, err := none.Revision(ctx); !errors.Is(err, sources.ErrNotFound) || !strings.Contains(err.Error(), `">=5"`) {
		t.Errorf("Revision with no matching tag = %v, want ErrNotFound naming the range", err)
	}
}

func TestDigestPin(t *testing.T) {
	ctx := testContext(t)
	reg := newTestRegistry(t, "", "")
	url := reg.URL("clusters/east")
	pushed := push(t, ctx, url, "v1", overlay(1))
	digest := pushed[strings.Index(pushed, "@")+1:]
	push(t, ctx, url, "v1", overlay(2)) // the tag moves on; the pin must not

	s := newSource(t, Options{URL: url, Ref: Ref{Digest: digest}})
	art, err := s.Fetch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if art.Revision != digest {
		t.Errorf("revision = %q, want %q", art.Revision, digest)
	}
	sameFiles(t, art.FS, overlay(1))
	reg.take()
	if rev, err := s.Revision(ctx); err != nil || rev != digest {
		t.Errorf("Revision = %q, %v; want %q", rev, err, digest)
	}
	if got := reg.take(); !sameRequests(got, []string{"HEAD manifests"}) {
		t.Errorf("pinned poll made %v, want [HEAD manifests]", got)
	}
	missing := newSource(t, Options{URL: url, Ref: Ref{Digest: "sha256:" + strings.Repeat("0", 64)}})
	if _, err := missing.Revision(ctx); !errors.Is(err, sources.ErrNotFound) {
		t.Errorf("Revision of a missing digest = %v, want ErrNotFound", err)
	}
}

func TestDockerConfigAuth(t *testing.T) {
	ctx := testContext(t)
	const user, password = "capstan", "pw-Qx7-never-print-me"
	reg := newTestRegistry(t, user, password)
	url := reg.URL("private/east")
	config := func(u, p string) []byte {
		auth := base64.StdEncoding.EncodeToString([]byte(u + ":" + p))
		return []byte(fmt.Sprintf(`{"auths":{"%s":{"auth":%q}}}`, reg.Host, auth))
	}
	pushed, err := Push(ctx, url, overlay(1), PushOptions{Tag: "v1", Auth: Auth{DockerConfig: config(user, password)}})
	if err != nil {
		t.Fatal(err)
	}

	anon := newSource(t, Options{URL: url, Ref: Ref{Tag: "v1"}})
	_, err = anon.Revision(ctx)
	if !errors.Is(err, sources.ErrAuth) || !strings.Contains(err.Error(), "secretRef") {
		t.Errorf("anonymous Revision = %v, want ErrAuth with a hint to set secretRef", err)
	}
	wrong := newSource(t, Options{URL: url, Ref: Ref{Tag: "v1"}, Auth: Auth{DockerConfig: config(user, "wrong-"+password)}})
	_, err = wrong.Revision(ctx)
	if !errors.Is(err, sources.ErrAuth) || !sources.IsStalled(err) {
		t.Errorf("Revision with a wrong password = %v, want ErrAuth", err)
	}
	if err != nil && strings.Contains(err.Error(), password) {
		t.Errorf("error quotes the password: %v", err)
	}
	good := newSource(t, Options{URL: url, Ref: Ref{Tag: "v1"}, Auth: Auth{DockerConfig: config(user, password)}})
	art, err := good.Fetch(ctx)
	if err != nil || art.Revision != pushed {
		t.Fatalf("Fetch with credentials = %v, %v; want revision %q", art, err, pushed)
	}
	// Credentials for another registry leave this one anonymous.
	other := newSource(t, Options{URL: url, Auth: Auth{DockerConfig: []byte(`{"auths":{"elsewhere.example":{"username":"a","password":"b"}}}`)}})
	if _, err := other.Revision(ctx); !errors.Is(err, sources.ErrAuth) {
		t.Errorf("Revision with credentials for another host = %v, want ErrAuth", err)
	}
}

func TestNewRefusesBadSettings(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"an empty URL", Options{}, "URL is empty"},
		{"an https URL", Options{URL: "https://registry.example/a"}, "must start with oci://"},
		{"credentials in the URL", Options{URL: "oci://user:hunter2pw@registry.example/a"}, "holds credentials"},
		{"no repository path", Options{URL: "oci://registry.example"}, "no repository path"},
		{"a tag in the URL", Options{URL: "oci://registry.example/a:v1"}, "in the ref"},
		{"a digest in the URL", Options{URL: "oci://registry.example/a@sha256:00"}, "in the ref"},
		{"an upper-case repository", Options{URL: "oci://registry.example/Clusters"}, "not a repository name"},
		{"two refs", Options{URL: "oci://r.example/a", Ref: Ref{Tag: "v1", SemVer: ">=1"}}, "only one of"},
		{"a bad tag", Options{URL: "oci://r.example/a", Ref: Ref{Tag: "v 1"}}, "not a valid tag"},
		{"a bad range", Options{URL: "oci://r.example/a", Ref: Ref{SemVer: ">=one"}}, "not a semver range"},
		{"a bad digest", Options{URL: "oci://r.example/a", Ref: Ref{Digest: "sha256:xyz"}}, "not a digest"},
		{"a docker config that is not JSON", Options{URL: "oci://r.example/a", Auth: Auth{DockerConfig: []byte("{")}}, "not valid JSON"},
		{"a docker config with only helpers", Options{URL: "oci://r.example/a", Auth: Auth{DockerConfig: []byte(`{"credsStore":"desktop"}`)}}, "credential helpers"},
		{"a docker config auth that is not base64", Options{URL: "oci://r.example/a", Auth: Auth{DockerConfig: []byte(`{"auths":{"r.example":{"auth":"%%hunter2pw%%"}}}`)}}, "not base64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.opts)
			if !errors.Is(err, sources.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New = %v, want ErrInvalid containing %q", err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), "hunter2pw") {
				t.Errorf("error quotes a credential: %v", err)
			}
		})
	}
}
