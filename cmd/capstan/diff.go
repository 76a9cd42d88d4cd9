package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/render"
	"github.com/capstan-dev/capstan/stages"
)

// Exit codes of `capstan diff`, as kubectl diff has them.
const (
	diffExitNone    = 0 // nothing would change
	diffExitChanges = 1 // something would change, or fail
	diffExitError   = 2 // the diff itself failed
)

// exitError ends the process with code; err, when set, is printed first.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// diffFlags are the flags of `capstan diff`.
type diffFlags struct {
	render     renderFlags
	cluster    clusterFlags
	deployment string
	output     string
	width      int
	pr         int64
	tokenEnv   string
	identity   identityFlags
}

func (f *diffFlags) BindFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.render.root, "root", "", rootFlagUsage)
	fs.StringVarP(&f.render.deployment, "cluster-deployment", "f", "", "ClusterDeployment file whose path, substitutions and stages to use; its live namesake gives the inventory")
	fs.StringArrayVar(&f.render.substitute, "substitute", nil, "VAR=value for ${VAR} substitution (repeatable)")
	f.render.bindDecryptionKey(fs)
	fs.StringVar(&f.deployment, "deployment", "", "NAMESPACE/NAME of the live ClusterDeployment whose spec (path, profile, substitutions) and inventory to use")
	fs.Int64Var(&f.pr, "pr", 0, "plan the head of this open pull request (GitLab: merge request) of --deployment's repository instead of PATH")
	fs.StringVar(&f.tokenEnv, "token-env", "", "with --pr: the environment variable holding the forge token (default: the deployment's spec.report.pullRequests.secretRef)")
	fs.StringVarP(&f.output, "output", "o", "text", "output format: text, yaml or json")
	fs.IntVar(&f.width, "width", 0, "wrap lines at this many columns (default: the terminal's width; no wrapping when not a terminal)")
	_ = fs.MarkHidden("width")
	f.identity.BindFlags(fs)
	f.cluster.BindFlags(fs)
}

func newDiffCommand() *cobra.Command {
	var f diffFlags
	cmd := &cobra.Command{
		Use:   "diff [PATH]",
		Short: "Show what applying a path would change in the live cluster, stage by stage",
		Long: `Diff renders PATH as render does, then asks the cluster of --kubeconfig what
applying it would do, without changing anything: every object is applied as a
server-side dry-run (field manager capstan, forced, with the owner labels,
exactly what the apply sends) and compared with the live object.

It prints, per stage, each object with a marker (+ create, ~ change,
- delete, = unchanged, ? not compared, ! a problem that would stop the
stage) and, for changes, only the fields that differ. Secret values are never printed. The
objects the deployment applied before and PATH drops are listed as pruned;
version and replica changes of MachineDeployments, KubeadmControlPlanes and
LCMClusters list the rollout that follows.

A stage that acts on another cluster (its kubeConfig, or the deployment's)
is compared there, through the kubeconfig Secret read from the cluster of
--kubeconfig; a stage whose cluster does not exist yet or does not answer
lists its objects as not compared (?), with the reason, and the others are
compared as usual.

Within the cluster of --kubeconfig, the deployment's objects are compared
as its ServiceAccount, as the daemon applies them: the API server
impersonates system:serviceaccount:NAMESPACE:NAME, named by
--service-account, else the deployment's spec.serviceAccountName (a
deployment relying on capstan run's --default-service-account needs
--service-account: the CLI cannot know the daemon's flags). A change the
ServiceAccount may not make is a problem (!) that names it. Your
kubeconfig's user needs the RBAC verb impersonate on that ServiceAccount;
--as-caller compares as that user instead. The ClusterDeployments (for the
owner check) and Secrets are read as your user, as the daemon reads them as
itself.

A plan that hands the bootstrap SSH key to the cluster (profile bootstrap)
renders ${CAPSTAN_BOOTSTRAP_SSH_KEY} with the key the daemon uses: the
public half of Secret capstan-bootstrap-key in the deployment's namespace
(read only; the private half is never shown). Until the daemon has made
that Secret, a placeholder key stands in, and the output says so.
--substitute CAPSTAN_BOOTSTRAP_SSH_KEY=... sets it yourself.

With --pr N, the tree is the head of open pull request N of the repository
--deployment reads (fetched from refs/pull/N/head with the deployment's git
credentials): the plan Capstan comments on the pull request.

The deployment's identity, profile and inventory come from --deployment
(the live ClusterDeployment) or -f (a ClusterDeployment file, whose live
namesake gives the inventory when it exists).

Exit status: 0 when nothing would change, 1 when something would (or an
object would fail, or a stage could not be compared), 2 when the diff
itself failed, the cluster of --kubeconfig not answering included: a
cluster that cannot be reached is never reported as objects that would fail.`,
		Example: `  capstan diff --root examples -f examples/clusters/demo/clusterdeployment.yaml
  capstan diff --root . clusters/edge-01 --deployment capstan-system/edge-01
  capstan diff --root . -f clusters/edge-01/clusterdeployment.yaml -o json
  capstan diff --pr 7 --deployment capstan-system/edge-01
  capstan diff --root . -f clusters/edge-01/clusterdeployment.yaml --service-account deployer
  capstan diff --root . clusters/edge-01 --deployment team-a/edge-01 --as-caller`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			changed, err := f.run(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), args)
			switch {
			case err != nil:
				return &exitError{code: diffExitError, err: err}
			case changed:
				return &exitError{code: diffExitChanges}
			}
			return nil
		},
	}
	f.BindFlags(cmd.Flags())
	return cmd
}

// diffTarget is the deployment a diff is for.
type diffTarget struct {
	owner stages.Owner
	spec  capstanv1.ClusterDeploymentSpec
	// live is the ClusterDeployment in the cluster, nil when there is none.
	live *capstanv1.ClusterDeployment
}

func (f *diffFlags) run(ctx context.Context, out, errOut io.Writer, args []string) (bool, error) {
	if f.output != "text" && f.output != "yaml" && f.output != "json" {
		return false, fmt.Errorf("--output %q: expected text, yaml or json", f.output)
	}
	if f.deployment != "" && f.render.deployment != "" {
		return false, errors.New("--deployment and -f exclude each other: the first reads the deployment from the cluster, the second from a file")
	}
	if err := f.identity.check(); err != nil {
		return false, err
	}
	cfg, err := f.cluster.restConfig()
	if err != nil {
		return false, err
	}
	changed, err := f.diff(ctx, cfg, out, errOut, args)
	return changed, notReached(ctx, cfg.Host, err)
}

// notReached says of err, when it is of a cluster that did not answer
// (the API server down, a load balancer without it, a timeout), that
// nothing was compared and what to check: a diff that could not look is
// not a diff with problems.
func notReached(ctx context.Context, host string, err error) error {
	if err == nil || ctx.Err() != nil || !(stages.IsUnreachable(err) || stages.IsUnanswered(err)) {
		return err
	}
	return fmt.Errorf("the cluster at %s could not be reached, so nothing was compared: %w\n"+
		"check that its API server is up and answers (kubectl get --raw /readyz with the same --kubeconfig and --context), "+
		"and that --kubeconfig and --context name the cluster you mean", host, err)
}

// diff is run once the cluster's address is known.
func (f *diffFlags) diff(ctx context.Context, cfg *rest.Config, out, errOut io.Writer, args []string) (bool, error) {
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		return false, fmt.Errorf("connect to %s: %w", cfg.Host, err)
	}
	target, err := f.target(ctx, c, args)
	if err != nil {
		return false, err
	}
	key, err := f.bootstrapKey(ctx, c, &target)
	if err != nil {
		return false, err
	}
	var plan *stages.Plan
	if f.pr != 0 {
		plan, err = f.pullRequestPlan(ctx, c, target, errOut)
	} else {
		plan, err = f.plan(ctx, target)
	}
	if err != nil {
		return false, err
	}
	sa := f.identity.serviceAccount(target.spec)
	d, err := reconciler.DiffPreview(ctx, c, target.owner, target.spec, target.live, plan,
		reconciler.PreviewOptions{ServiceAccount: sa, Config: cfg})
	if err != nil {
		return false, fmt.Errorf("diff against %s: %w", cfg.Host, asCallerHint(err))
	}
	report := diffReport{Deployment: target.owner.Namespace + "/" + target.owner.Name, Server: cfg.Host, BootstrapKey: key, Diff: d}
	if sa != "" {
		report.ServiceAccount = target.owner.Namespace + "/" + sa
	}
	if target.live != nil {
		report.LiveRevision = target.live.Status.Revision
	}
	if err := printDiff(out, report, f.output, f.lineWidth(out)); err != nil {
		return false, err
	}
	return d.Changes(), nil
}

// target finds the deployment the diff is for: the live one --deployment
// names, the one of the -f file (and its live namesake), or, with
// neither, a deployment named after PATH in the default namespace.
func (f *diffFlags) target(ctx context.Context, c client.Client, args []string) (diffTarget, error) {
	var t diffTarget
	if f.deployment != "" {
		ns, name, ok := strings.Cut(f.deployment, "/")
		if !ok || ns == "" || name == "" {
			return t, fmt.Errorf("--deployment %q: expected NAMESPACE/NAME", f.deployment)
		}
		t.owner = stages.Owner{Name: name, Namespace: ns}
		live, err := getDeployment(ctx, c, t.owner)
		if err != nil {
			return t, err
		}
		if live == nil {
			return t, fmt.Errorf("--deployment %s: no such ClusterDeployment in the cluster", f.deployment)
		}
		t.live = live
		t.spec = *live.Spec.DeepCopy()
		if len(args) == 1 {
			if err := f.render.locate(&t.spec, args[0]); err != nil {
				return t, err
			}
		}
		if f.render.root == "" {
			f.render.root = "."
		}
		for _, kv := range f.render.substitute {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return t, fmt.Errorf("--substitute %q: expected VAR=value", kv)
			}
			if t.spec.Substitute == nil {
				t.spec.Substitute = map[string]string{}
			}
			t.spec.Substitute[k] = v
		}
		return t, nil
	}
	spec, err := f.render.givenSpec(args)
	if err != nil {
		return t, err
	}
	t.spec = spec
	if f.render.deployment != "" {
		cd, err := readDeploymentFile(f.render.deployment)
		if err != nil {
			return t, err
		}
		t.owner = stages.Owner{Name: cd.Name, Namespace: cd.Namespace}
		if t.owner.Namespace == "" {
			t.owner.Namespace = defaultNamespace
		}
	} else {
		t.owner = stages.Owner{Name: filepath.Base(filepath.Clean(f.render.where)), Namespace: defaultNamespace}
	}
	if t.live, err = getDeployment(ctx, c, t.owner); err != nil {
		return t, err
	}
	return t, nil
}

func readDeploymentFile(file string) (*capstanv1.ClusterDeployment, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var cd capstanv1.ClusterDeployment
	if err := yaml.Unmarshal(data, &cd); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return &cd, nil
}

// getDeployment reads a ClusterDeployment; nil when there is none (or the
// cluster does not serve the kind).
func getDeployment(ctx context.Context, c client.Client, o stages.Owner) (*capstanv1.ClusterDeployment, error) {
	cd := &capstanv1.ClusterDeployment{}
	err := c.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: o.Name}, cd)
	switch {
	case apierrors.IsNotFound(err), meta.IsNoMatchError(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read ClusterDeployment %s/%s: %w", o.Namespace, o.Name, err)
	}
	return cd, nil
}

// plan renders the deployment's path and builds its plan, as the
// reconciler does.
func (f *diffFlags) plan(ctx context.Context, t diffTarget) (*stages.Plan, error) {
	opts, err := f.renderOptions()
	if err != nil {
		return nil, err
	}
	plan, err := reconciler.PlanTree(ctx, reconciler.PlanInput{
		FS: os.DirFS(f.render.root), Where: f.render.root, Spec: t.spec, Live: t.live, Render: opts,
	})
	return plan, keyHint(err)
}

// keyHint adds to a render that found encrypted files without a key what
// the command needs.
func keyHint(err error) error {
	var de *render.DecryptError
	if errors.As(err, &de) && de.Reason == render.ReasonDecryptionKeyMissing {
		return fmt.Errorf("%w; for capstan diff, give --decryption-key FILE (or $%s)", err, sopsAgeKeyFileEnv)
	}
	return err
}

// renderOptions are the render's options: sops files decrypted with
// --decryption-key (or $SOPS_AGE_KEY_FILE), in memory. The diff hides the
// values of what was decrypted, whatever its kind, as it hides Secrets'.
// Without a key an encrypted file is an error that says which key to
// give, as in the daemon: its ciphertext would be no diff of anything.
func (f *diffFlags) renderOptions() (render.Options, error) {
	opts := render.DefaultOptions()
	keys, err := f.render.keys()
	if err != nil {
		return opts, err
	}
	if keys == nil {
		keys = &render.Keys{}
	}
	opts.Decrypt = keys
	return opts, nil
}

// lineWidth is the width to wrap at: --width, else the terminal's, else
// none.
func (f *diffFlags) lineWidth(out io.Writer) int {
	if f.width > 0 {
		return f.width
	}
	file, ok := out.(*os.File)
	if !ok || !term.IsTerminal(int(file.Fd())) {
		return 0
	}
	if w, _, err := term.GetSize(int(file.Fd())); err == nil && w > 0 {
		return w
	}
	return 0
}
