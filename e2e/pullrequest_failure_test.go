package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/reconciler/report"
)

// When the forge refuses the comment (403, its error quoting the token as
// a careless proxy might) and then fails (500), the watcher counts every
// failed request, tells the deployment once per kind of failure (a
// Warning event, an error log line) however many times it repeats, and
// once the forge works again says so and writes the comment. The token is
// in no event, log line or metric.
func TestPullRequestReportFailuresAreCountedAndTold(t *testing.T) {
	s := realGitea(t)
	ctx := context.Background()
	c := newClient(t)
	ns := newNamespace(t)
	repo, err := s.CreateRepo(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, repo, "main", cmOverlay("1"), "v1"); err != nil {
		t.Fatal(err)
	}
	token := giteaSecrets(t, s, c, ns)
	forges := &forgeAudit{}
	failWrites := func(code int, message string) {
		forges.setFault(func(req *http.Request) (int, string) {
			if req.Method == http.MethodGet || !commentWrite.MatchString(req.URL.Path) {
				return 0, ""
			}
			return code, fmt.Sprintf(`{"message": %q, "url": "%s/api/swagger"}`, message, s.URL())
		})
	}
	failWrites(http.StatusForbidden, "token "+token+" does not have at least one of required scope(s): [write:issue]")
	reg := prometheus.NewRegistry()
	logs := &logBuffer{}
	startDaemonWith(t, nil, func(o *reconciler.Options) {
		o.Report.Interval = time.Second
		o.Report.ForgeTransport = forges.transport("capstan")
		o.MetricsRegistry, o.Logger = reg, logs.logger()
	})
	createDeployment(t, c, ns, "app", capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: s.CloneURL(repo), Ref: capstanv1.GitRef{Branch: "main"},
			SecretRef: &capstanv1.LocalObjectReference{Name: "git-auth"}}},
		Path:       "app",
		Substitute: map[string]string{"NS": ns, "NAME": "app"},
		Interval:   &metav1.Duration{Duration: time.Minute},
		Report: &capstanv1.ReportSpec{PullRequests: &capstanv1.PullRequestReport{
			Provider: capstanv1.ForgeGitea, BaseURL: s.URL(),
			SecretRef: capstanv1.LocalObjectReference{Name: "forge-token"},
			Interval:  &metav1.Duration{Duration: time.Second},
		}},
	})
	waitDeployment(t, c, ns, "app", "Ready", isReady)
	head, err := s.Commit(ctx, repo, "change", cmOverlay("2"), "v2")
	if err != nil {
		t.Fatal(err)
	}
	pr, err := s.OpenPullRequest(ctx, repo, "change", "main", "v2")
	if err != nil {
		t.Fatal(err)
	}

	failures := func(reason string) float64 {
		return metricValue(t, reg, "capstan_pullrequest_report_failures_total", map[string]string{"forge": "gitea", "reason": reason}, 0)
	}
	events := func(reason, word string) []eventsv1.Event {
		list := &eventsv1.EventList{}
		if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var out []eventsv1.Event
		for _, e := range list.Items {
			if e.Reason == reason && e.Regarding.Name == "app" && strings.Contains(e.Note, word) {
				out = append(out, e)
			}
		}
		return out
	}
	errorLines := func(reason string) int {
		n := 0
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, `"msg"="pull requests: the forge failed`) && strings.Contains(line, `"reason"="`+reason+`"`) {
				n++
			}
		}
		return n
	}
	// repeated waits until a failure of reason was counted three times
	// (three rounds), then checks that it was told once.
	repeated := func(reason string) {
		t.Helper()
		waitFor(t, "three "+reason+" failures counted", func() (bool, error) {
			return failures(reason) >= 3, fmt.Errorf("%v counted", failures(reason))
		})
		waitFor(t, "a Warning event saying "+reason, func() (bool, error) {
			return len(events(report.ReasonPullRequestReportFailed, reason)) > 0, nil
		})
		if n := len(events(report.ReasonPullRequestReportFailed, reason)); n != 1 {
			t.Errorf("%d %s events saying %s, want one however often it repeats", n, report.ReasonPullRequestReportFailed, reason)
		}
		if n := errorLines(reason); n != 1 {
			t.Errorf("%d error log lines for %s after %v failures, want one", n, reason, failures(reason))
		}
	}

	// 1. The forge refuses the comment.
	repeated("forbidden")
	if e := events(report.ReasonPullRequestReportFailed, "forbidden")[0]; e.Type != corev1.EventTypeWarning ||
		!strings.Contains(e.Note, "write the pull request comment") || !strings.Contains(e.Note, "HTTP 403") {
		t.Errorf("the event does not say what failed, how, and that it is a warning: %s %q", e.Type, e.Note)
	}
	// 2. The forge fails.
	failWrites(http.StatusInternalServerError, "internal server error")
	repeated("server_error")
	// 3. The forge works again: the comment is written, and that is told.
	forges.setFault(nil)
	waitComment(t, s, repo, pr.Number, "the plan, once the forge works again", func(b string) bool { return strings.Contains(b, head) })
	waitFor(t, "a Normal event saying the comment works again", func() (bool, error) {
		return len(events(report.ReasonPullRequestReportRecovered, "write the pull request comment")) == 1, nil
	})
	if !strings.Contains(logs.String(), `"msg"="pull requests: the forge works again"`) {
		t.Error("no log line says the forge works again")
	}

	// The planted token is nowhere.
	all := &eventsv1.EventList{}
	if err := c.List(ctx, all, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var notes strings.Builder
	for _, e := range all.Items {
		notes.WriteString(e.Note + "\n")
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for what, text := range map[string]string{"events": notes.String(), "logs": logs.String(), "metrics": fmt.Sprint(families)} {
		if strings.Contains(text, token) {
			t.Errorf("the forge token is in the %s", what)
		}
	}
	if !strings.Contains(notes.String(), "[redacted]") {
		t.Errorf("the forge's error quoted the token, but no event shows it redacted:\n%s", notes.String())
	}
}
