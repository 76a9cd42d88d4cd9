package e2e

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/reconciler"
)

const hookSecret = "e2e-hook-secret"

func githubPush(t *testing.T, url, secret string, body []byte) int {
	t.Helper()
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", "push")
	req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac.Sum(nil)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A signed GitHub push for the followed branch reconciles the deployment
// at once, although its poll interval is an hour away; a wrongly signed one
// and a push to another branch change nothing.
func TestWebhookPushReconcilesAtOnce(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, twoStageFiles("1"), "v1"); err != nil {
		t.Fatal(err)
	}
	d, _ := startDaemonWith(t, nil, func(o *reconciler.Options) {
		o.Webhook = &reconciler.WebhookOptions{Addr: "127.0.0.1:0", GitHubSecret: []byte(hookSecret)}
	})
	spec := twoStageSpec(url, ns, gitSecret(t, c, ns))
	spec.Interval = &metav1.Duration{Duration: time.Hour}
	createDeployment(t, c, ns, "two", spec)
	waitFor(t, "Widget infra", func() (bool, error) { return object(t, c, widgetGVK, ns, "infra") != nil, nil })
	setWidgetReady(t, c, ns, "infra")
	waitDeployment(t, c, ns, "two", "Ready", isReady)

	second, err := gitSrv.Commit(ns, gitserver.DefaultBranch, twoStageFiles("2"), "v2")
	if err != nil {
		t.Fatal(err)
	}
	hook := d.WebhookURL() + "github"
	push := []byte(`{"ref": "refs/heads/main", "after": "` + second + `", "repository": {"clone_url": "` + url + `"}}`)
	if code := githubPush(t, hook, "wrong-secret", push); code != http.StatusUnauthorized {
		t.Errorf("wrongly signed push: HTTP %d, want 401", code)
	}
	other := []byte(`{"ref": "refs/heads/feature", "after": "` + second + `", "repository": {"clone_url": "` + url + `"}}`)
	if code := githubPush(t, hook, hookSecret, other); code != http.StatusAccepted {
		t.Errorf("push to a branch nobody follows: HTTP %d, want 202 (ignored)", code)
	}
	if cd := getDeployment(t, c, ns, "two"); cd.Status.Revision == "main@sha1:"+second {
		t.Fatal("the new revision was picked up before any valid push")
	}

	posted := time.Now()
	if code := githubPush(t, hook, hookSecret, push); code/100 != 2 {
		t.Fatalf("signed push: HTTP %d, want 2xx", code)
	}
	waitDeployment(t, c, ns, "two", "Ready at the pushed revision", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.Revision == "main@sha1:"+second && isReady(cd)
	})
	t.Logf("signed push POST -> new revision Ready in status: %s", time.Since(posted))
	if v := object(t, c, configMapGVK, ns, "app-config").Object["data"].(map[string]any)["version"]; v != "2" {
		t.Errorf("app-config version = %v after the push, want 2", v)
	}
}
