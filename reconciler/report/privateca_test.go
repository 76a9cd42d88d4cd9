package report

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/testca"
	"github.com/capstan-dev/capstan/sources/git"
)

// caFixture is a namespace of the shared control plane, a client for it
// and a CA no system trusts.
type caFixture struct {
	ns string
	c  client.Client
	ca *testca.CA
}

func newCAFixture(t *testing.T, ctx context.Context) *caFixture {
	t.Helper()
	e, _ := controlPlaneAndGitea(t)
	c := kubeClient(t, e)
	ns, err := e.CreateNamespace(ctx, "private-ca")
	if err != nil {
		t.Fatal(err)
	}
	ca := testca.Must(t, "capstan-report-test-ca")
	return &caFixture{ns: ns, c: c, ca: ca}
}

func (f *caFixture) secret(t *testing.T, ctx context.Context, name string, data map[string]string) {
	t.Helper()
	if err := f.c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}, StringData: data}); err != nil {
		t.Fatal(err)
	}
}

// event waits for the next event and returns it.
func nextEvent(t *testing.T, rec *events.FakeRecorder, what string) string {
	t.Helper()
	select {
	case e := <-rec.Events:
		return e
	case <-time.After(time.Minute):
		t.Fatalf("%s: no event within a minute", what)
		return ""
	}
}

// Status commits to a git server over https whose certificate a private
// CA signed: the ca.crt of the credentials Secret makes them work; without
// it the event says to put the CA there, naming the Secret; a ca.crt
// without a certificate is refused with the Secret and the key named.
func TestStatusCommitsTrustTheCAOfTheirSecret(t *testing.T) {
	ctx := testContext(t)
	f := newCAFixture(t, ctx)
	cert, err := f.ca.ServerCertificate()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := gitserver.New("", gitserver.Options{Username: testUser, Password: testPassword, TLSCertificate: &cert})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	creds := map[string]string{"username": testUser, "password": testPassword}
	with := func(k, v string) map[string]string {
		out := map[string]string{k: v}
		for k, v := range creds {
			out[k] = v
		}
		return out
	}
	f.secret(t, ctx, "with-ca", with("ca.crt", string(f.ca.PEM)))
	f.secret(t, ctx, "without-ca", creds)
	f.secret(t, ctx, "garbage-ca", with("ca.crt", "not a certificate"))

	rec := events.NewFakeRecorder(100)
	r, err := New(Options{Interval: 2 * time.Second, Settle: 100 * time.Millisecond, Registerer: prometheus.NewRegistry()}, f.c, rec)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Start(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("reporter: %v", err)
		}
	})

	for _, tt := range []struct {
		secret    string
		wantEvent string // "": committed
	}{
		{secret: "with-ca"},
		{secret: "without-ca", wantEvent: "put the CA's certificate (PEM) in key ca.crt of Secret " + f.ns + "/without-ca (the credentials of status commits)"},
		{secret: "garbage-ca", wantEvent: "Secret " + f.ns + `/garbage-ca: key "ca.crt": holds no PEM certificate`},
	} {
		t.Run(tt.secret, func(t *testing.T) {
			url, err := srv.CreateRepo(tt.secret)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := srv.Commit(tt.secret, "main", map[string]string{"clusters/a.yaml": "kind: ClusterDeployment\n"}, "initial"); err != nil {
				t.Fatal(err)
			}
			cd := deployment(tt.secret, 1)
			cd.Namespace = f.ns
			cd.Spec.Source = &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: url, Ref: capstanv1.GitRef{Branch: "main"}}}
			cd.Spec.Report = &capstanv1.ReportSpec{GitStatus: &capstanv1.GitStatusReport{SecretRef: &capstanv1.LocalObjectReference{Name: tt.secret}}}
			r.Notify(cd)
			if tt.wantEvent != "" {
				e := nextEvent(t, rec, tt.secret)
				if !strings.HasPrefix(e, "Warning StatusCommitFailed") || !strings.Contains(e, tt.wantEvent) || strings.Contains(e, testPassword) {
					t.Errorf("event %q, want a StatusCommitFailed saying %q, without the password", e, tt.wantEvent)
				}
				return
			}
			path := Path(f.ns, tt.secret)
			deadline := time.Now().Add(time.Minute)
			for {
				cmd := exec.Command("git", "show", capstanv1.DefaultStatusBranch+":"+path)
				cmd.Env = []string{"GIT_DIR=" + srv.RepoPath(tt.secret), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null"}
				if out, err := cmd.Output(); err == nil && strings.Contains(string(out), "Stage1") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no status file %s on branch %s within a minute", path, capstanv1.DefaultStatusBranch)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// The pull request watcher reaches a forge (the real Gitea) behind an
// https proxy whose certificate a private CA signed when the token Secret
// holds the CA in ca.crt: the plan is commented. Without it, or with a
// ca.crt that holds no certificate, the deployment's event says what to
// put where, naming the Secret.
func TestPullRequestsTrustTheCAOfTheTokenSecret(t *testing.T) {
	ctx := testContext(t)
	f := newCAFixture(t, ctx)
	_, gitea := controlPlaneAndGitea(t)
	proxy := f.ca.ProxyFor(t, gitea.URL())
	rec := events.NewFakeRecorder(100)
	// Only this test's deployments: the other tests' share the cluster.
	w, err := NewPullRequests(PullRequestOptions{Interval: 100 * time.Millisecond, Registerer: prometheus.NewRegistry(), Events: rec},
		client.NewNamespacedClient(f.c, f.ns), shopPlanner{planFixture(t, "shop.json")})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		secret    string
		ca        string
		wantEvent string // "": the plan is commented
	}{
		{secret: "with-ca", ca: string(f.ca.PEM)},
		{secret: "without-ca", wantEvent: "put the CA's certificate (PEM) in key ca.crt of Secret " + f.ns + "/without-ca (spec.report.pullRequests.secretRef)"},
		{secret: "garbage-ca", ca: "not a certificate", wantEvent: "Secret " + f.ns + `/garbage-ca: key "ca.crt": holds no PEM certificate`},
	} {
		t.Run(tt.secret, func(t *testing.T) {
			repo, err := gitea.CreateRepo(ctx, f.ns+"-"+tt.secret)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := gitea.Commit(ctx, repo, "main", map[string]string{"app/cm.yaml": "v: 1\n"}, "v1"); err != nil {
				t.Fatal(err)
			}
			if _, err := gitea.Commit(ctx, repo, "scale", map[string]string{"app/cm.yaml": "v: 2\n"}, "scale"); err != nil {
				t.Fatal(err)
			}
			pr, err := gitea.OpenPullRequest(ctx, repo, "scale", "main", "scale")
			if err != nil {
				t.Fatal(err)
			}
			token, err := gitea.NewToken(ctx, "capstan-"+f.ns+"-"+tt.secret, "write:issue", "write:repository")
			if err != nil {
				t.Fatal(err)
			}
			data := map[string]string{"token": token}
			if tt.ca != "" {
				data["ca.crt"] = tt.ca
			}
			f.secret(t, ctx, tt.secret, data)
			cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Name: tt.secret, Namespace: f.ns}, Spec: capstanv1.ClusterDeploymentSpec{
				Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: gitea.CloneURL(repo), Ref: capstanv1.GitRef{Branch: "main"}}},
				Path:   "app",
				Report: &capstanv1.ReportSpec{PullRequests: &capstanv1.PullRequestReport{
					Provider: capstanv1.ForgeGitea, BaseURL: proxy.URL, Repository: repo.String(),
					SecretRef: capstanv1.LocalObjectReference{Name: tt.secret},
				}},
			}}
			if err := f.c.Create(ctx, cd); err != nil {
				t.Fatal(err)
			}
			// The other tests' watchers read every namespace.
			t.Cleanup(func() {
				if err := f.c.Delete(context.Background(), cd); err != nil {
					t.Error(err)
				}
			})
			deadline := time.Now().Add(time.Minute)
			for {
				w.round(ctx)
				if tt.wantEvent == "" {
					cs, err := gitea.Comments(ctx, repo, pr.Number)
					if err != nil {
						t.Fatal(err)
					}
					if len(cs) > 0 && strings.HasPrefix(cs[0].Body, PlanMarker+"\n"+planHeading) {
						return
					}
				} else {
					select {
					case e := <-rec.Events:
						if !strings.HasPrefix(e, "Warning "+ReasonPullRequestReportFailed) || !strings.Contains(e, tt.wantEvent) || strings.Contains(e, token) {
							t.Errorf("event %q, want a %s saying %q, without the token", e, ReasonPullRequestReportFailed, tt.wantEvent)
						}
						return
					default:
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("neither the plan comment nor the event %q within a minute", tt.wantEvent)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// Status commits to the root repository use the root source's
// credentials: an untrusted certificate there points at capstan run's
// --source-ca-file / $CAPSTAN_SOURCE_CA, the one place the root's CA can
// be set, not at a Secret the root source does not have. The push goes to
// a real git server over https with a CA the root was not given.
func TestRootStatusCommitsNameTheSourceCAFile(t *testing.T) {
	ctx := testContext(t)
	cert, err := testca.Must(t, "capstan-root-ca").ServerCertificate()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := gitserver.New("", gitserver.Options{Username: testUser, Password: testPassword, TLSCertificate: &cert})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	url, err := srv.CreateRepo("root")
	if err != nil {
		t.Fatal(err)
	}
	root := &Root{URL: url, Branch: "main", Auth: git.Auth{Username: testUser, Password: testPassword}}
	tgt, err := resolve(ctx, nil, batch{address: address{url: url, branch: "capstan/status", root: true}}, root)
	if err != nil {
		t.Fatal(err)
	}
	_, err = push(ctx, pushRequest{url: url, branch: "capstan/status", auth: tgt.auth, caFrom: tgt.caFrom,
		files: map[string][]byte{"status/ns/a.yaml": []byte("phase: Ready\n")}, message: "status"})
	if err == nil || !strings.Contains(err.Error(), "--source-ca-file or $CAPSTAN_SOURCE_CA") || strings.Contains(err.Error(), "secretRef") {
		t.Errorf("push to the root repository behind an unknown CA: %v; want the hint to name --source-ca-file and $CAPSTAN_SOURCE_CA, no secretRef", err)
	}
	if err != nil && strings.Contains(err.Error(), testPassword) {
		t.Errorf("the error holds the password: %v", err)
	}
}
