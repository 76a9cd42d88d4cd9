package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/sopstest"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/reconciler/report"
)

// sopsReportFiles is an overlay of stage Config: a plaintext ConfigMap, a
// Secret whose values are sops-encrypted, and a whole ConfigMap
// encrypted (a decrypted document that is not a Secret), with password in
// both, for key.
func sopsReportFiles(t *testing.T, hosts int, password string, key *age.X25519Identity) map[string]string {
	secret := `apiVersion: v1
kind: Secret
metadata:
  name: bmc-credentials
  namespace: ${NS}
  labels: {capstan.dev/stage: Config}
stringData:
  username: admin
  password: ` + password + "\n"
	vendor := `apiVersion: v1
kind: ConfigMap
metadata:
  name: bmc-vendor
  namespace: ${NS}
  labels: {capstan.dev/stage: Config}
data:
  token: ` + password + "-vendor\n"
	return map[string]string{
		"clusters/bmc/kustomization.yaml": "resources: [settings.yaml, credentials.yaml, vendor.yaml]\n",
		"clusters/bmc/settings.yaml": fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: bmc-settings
  namespace: ${NS}
  labels: {capstan.dev/stage: Config}
data: {hosts: "%d"}
`, hosts),
		"clusters/bmc/credentials.yaml": sopstest.EncryptSecretYAML(t, secret, key),
		"clusters/bmc/vendor.yaml":      string(sopstest.MustEncrypt(t, sopstest.FormatYAML, []byte(vendor), "^data$", sopstest.Age(key))),
	}
}

// A deployment with sops-encrypted files that reports everywhere (status
// commits, pull request comments and commit statuses on a real Gitea): a
// pull request that changes the encrypted values is planned with them
// decrypted in memory, and its comment names the Secret and the
// decrypted ConfigMap that would change without a value; after the merge
// the new plaintext is live. No planted value reaches the comments, the
// commit statuses, the status branch, `capstan diff --pr`, the logs,
// the events, the status or the artifact cache.
func TestSopsPlaintextStaysOutOfReports(t *testing.T) {
	s := realGitea(t)
	ctx := context.Background()
	c := newClient(t)
	ns := newNamespace(t)
	repo, err := s.CreateRepo(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	key := sopstest.NewAgeKey(t)
	const first, second = "PLANTED-sops-pr-first-8c1f", "PLANTED-sops-pr-second-d93b"
	if _, err := s.Commit(ctx, repo, "main", sopsReportFiles(t, 2, first, key), "encrypted BMC credentials"); err != nil {
		t.Fatal(err)
	}
	token := giteaSecrets(t, s, c, ns)
	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sops-keys", Namespace: ns},
		Data: map[string][]byte{"bmc.agekey": sopstest.AgeKeyFile(key)}}); err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	cacheDir := t.TempDir()
	startDaemonWith(t, nil, func(o *reconciler.Options) {
		o.Report.Interval = time.Second
		o.Logger = logs.logger()
		o.Artifacts.CacheDir = cacheDir
	})
	createDeployment(t, c, ns, "bmc", capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
			URL: s.CloneURL(repo), Ref: capstanv1.GitRef{Branch: "main"},
			SecretRef: &capstanv1.LocalObjectReference{Name: "git-auth"},
		}},
		Path:       "clusters/bmc",
		Substitute: map[string]string{"NS": ns},
		Interval:   &metav1.Duration{Duration: 500 * time.Millisecond},
		Stages:     []capstanv1.StageSpec{{Name: "Config"}},
		Decryption: &capstanv1.DecryptionSpec{Provider: capstanv1.DecryptionSOPS, SecretRef: capstanv1.LocalObjectReference{Name: "sops-keys"}},
		Report: &capstanv1.ReportSpec{
			GitStatus: &capstanv1.GitStatusReport{Interval: &metav1.Duration{Duration: time.Second}},
			PullRequests: &capstanv1.PullRequestReport{
				Provider: capstanv1.ForgeGitea, BaseURL: s.URL(),
				SecretRef: capstanv1.LocalObjectReference{Name: "forge-token"},
				Interval:  &metav1.Duration{Duration: time.Second},
			},
		},
	})
	waitDeployment(t, c, ns, "bmc", "Ready", isReady)
	waitSecretValue(t, c, ns, "bmc-credentials", first)

	// A pull request that changes the encrypted values (and a plain one).
	head, err := s.Commit(ctx, repo, "rotate", sopsReportFiles(t, 3, second, key), "New BMC passwords")
	if err != nil {
		t.Fatal(err)
	}
	pr, err := s.OpenPullRequest(ctx, repo, "rotate", "main", "New BMC passwords")
	if err != nil {
		t.Fatal(err)
	}
	comment := waitComment(t, s, repo, pr.Number, "the plan of the head", func(b string) bool { return strings.Contains(b, head) })
	for _, want := range []string{"**Secrets that change** (their values are never shown): `Secret/" + ns + "/bmc-credentials` (changed).", "data.password: (changed)", "ConfigMap/" + ns + "/bmc-vendor", `data.hosts: "2" -> "3"`} {
		if !strings.Contains(comment.Body, want) {
			t.Errorf("the plan lacks %q:\n%s", want, comment.Body)
		}
	}
	for _, not := range []string{"cannot be applied", "ENC[", "sops"} {
		if strings.Contains(comment.Body, not) {
			t.Errorf("the plan holds %q: the encrypted files were not decrypted for it:\n%s", not, comment.Body)
		}
	}

	// `capstan diff --pr` prints the plan locally.
	cli := exec.Command(capstanBinary(t), "diff", "--pr", fmt.Sprint(pr.Number), "--deployment", ns+"/bmc",
		"--token-env", "E2E_FORGE_TOKEN", "--kubeconfig", env.KubeconfigPath)
	cli.Env = append(os.Environ(), "E2E_FORGE_TOKEN="+token)
	cliOut, _ := cli.CombinedOutput()
	if !strings.Contains(string(cliOut), "bmc-credentials") {
		t.Errorf("capstan diff --pr does not show the Secret:\n%s", cliOut)
	}

	// The merge rolls out with the new plaintext.
	merge, err := s.MergePullRequest(ctx, repo, pr.Number)
	if err != nil {
		t.Fatal(err)
	}
	waitDeployment(t, c, ns, "bmc", "Ready at the merge", func(cd *capstanv1.ClusterDeployment) bool {
		return isReady(cd) && cd.Status.Revision == "main@sha1:"+merge
	})
	waitSecretValue(t, c, ns, "bmc-credentials", second)
	waitComment(t, s, repo, pr.Number, "the rollout Ready", func(b string) bool { return strings.Contains(b, ":white_check_mark:") })
	waitFor(t, "the status file at the merge, Ready", func() (bool, error) {
		out, err := giteaGit(t, s, repo, "show", "origin/"+statusBranch+":"+report.Path(ns, "bmc"))
		return err == nil && strings.Contains(out, "phase: Ready") && strings.Contains(out, merge), err
	})
	statuses, err := s.CommitStatuses(ctx, repo, merge)
	if err != nil {
		t.Fatal(err)
	}

	// The plaintext is nowhere but in the live objects.
	history, _ := giteaGit(t, s, repo, "log", "-p", "origin/"+statusBranch)
	cd := getDeployment(t, c, ns, "bmc")
	status, _ := json.Marshal(cd.Status)
	var events eventsv1.EventList
	if err := c.List(ctx, &events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	eventText, _ := json.Marshal(events.Items)
	texts := map[string]string{"the status branch": history, "capstan diff --pr": string(cliOut), "the daemon's logs": logs.String(),
		"the status": string(status), "the events": string(eventText)}
	for i, cm := range ourComments(t, s, repo, pr.Number) {
		texts[fmt.Sprintf("comment %d", i)] = cm.Body
	}
	for i, st := range statuses {
		texts[fmt.Sprintf("commit status %d", i)] = st.Description + " " + st.TargetURL
	}
	for _, secret := range []string{first, second, key.String()} {
		for where, text := range texts {
			if strings.Contains(text, secret) {
				t.Errorf("%s holds a planted value or the key (%.12s...)", where, secret)
			}
		}
		if hit := grepDir(t, cacheDir, secret); hit != "" {
			t.Errorf("the artifact cache holds a planted value in %s", hit)
		}
	}
}
