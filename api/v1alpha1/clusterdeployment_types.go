package v1alpha1

import (
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ClusterDeploymentKind is the kind of ClusterDeployment objects.
const ClusterDeploymentKind = "ClusterDeployment"

// ClusterDeploymentSpec says which overlay describes a cluster, from which
// source, and in which stages it is applied.
// +kubebuilder:validation:XValidation:rule="!has(self.report) || !has(self.report.gitStatus) || !has(self.source) || !has(self.source.git) || (has(self.report.gitStatus.url) && self.report.gitStatus.url != self.source.git.url) || (has(self.report.gitStatus.branch) ? self.report.gitStatus.branch : 'capstan/status') != (has(self.source.git.ref) && has(self.source.git.ref.branch) ? self.source.git.ref.branch : 'main')",message="spec.report.gitStatus.branch is the branch spec.source.git reads: a status commit would trigger a reconcile of itself; pick another branch (default capstan/status)"
type ClusterDeploymentSpec struct {
	// Source is where the overlay is read from. When empty, the deployment
	// uses the root source of the daemon that discovered it (`capstan run
	// --source`), and Path is relative to that source's root.
	// +optional
	Source *SourceSpec `json:"source,omitempty"`

	// Path is the kustomize overlay directory inside the source artifact.
	// +kubebuilder:validation:MinLength=1
	Path string `json:"path"`

	// Substitute holds values for ${VAR} post-build substitution.
	// +optional
	Substitute map[string]string `json:"substitute,omitempty"`

	// Profile names a built-in stage plan. Ignored when Stages is set.
	// +optional
	Profile string `json:"profile,omitempty"`

	// Stages is an explicit, ordered stage plan. A stage's objects are not
	// applied before every earlier stage is Ready.
	// +optional
	Stages []StageSpec `json:"stages,omitempty"`

	// Interval is how often the source is polled for a new revision and the
	// plan walked again. Defaults to 1m.
	// +optional
	Interval *metav1.Duration `json:"interval,omitempty"`

	// Suspend stops reconciling this deployment; nothing is fetched or applied.
	// Defaults to false (the API server fills it in, so that kubectl's
	// Suspended column says false rather than <none>).
	// +optional
	// +kubebuilder:default=false
	Suspend bool `json:"suspend,omitempty"`

	// DependsOn lists ClusterDeployments that must be Ready (at their
	// current generation) before this one applies anything: a cluster's
	// LCM layer after its machines, a workload cluster after the
	// management cluster that runs its controllers.
	// +optional
	DependsOn []DependencyReference `json:"dependsOn,omitempty"`

	// Rollout holds the defaults of every rollout stage of the plan.
	// +optional
	Rollout *RolloutPolicy `json:"rollout,omitempty"`

	// KubeConfig, when set, makes every stage act on the cluster this
	// kubeconfig reaches instead of the one Capstan runs in; a stage's own
	// kubeConfig overrides it. While that cluster cannot be reached the
	// stage waits (InProgress), it does not fail.
	// +optional
	KubeConfig *KubeConfigReference `json:"kubeConfig,omitempty"`

	// Prune says what happens to objects this deployment applied and its
	// source no longer declares: they are deleted once the new revision is
	// Ready, in reverse stage order, except objects labelled or annotated
	// capstan.dev/prune: disabled and, unless Destructive is set, objects
	// of destructive kinds (docs/ownership.md).
	// +optional
	Prune *PruneSpec `json:"prune,omitempty"`

	// DeletionPolicy says what deleting this ClusterDeployment does to the
	// objects it applied: Delete (the default) deletes them in reverse
	// stage order, under the same rules as pruning; Orphan leaves them.
	// +optional
	// +kubebuilder:validation:Enum=Delete;Orphan
	DeletionPolicy DeletionPolicy `json:"deletionPolicy,omitempty"`

	// Drift says what happens when an applied object is deleted or a field
	// Capstan applied is changed by someone else: correct (the default)
	// applies that object again, report only emits an event and counts
	// it, ignore does neither.
	// +optional
	// +kubebuilder:validation:Enum=correct;report;ignore
	Drift DriftPolicy `json:"drift,omitempty"`

	// ServiceAccountName names a ServiceAccount of the deployment's
	// namespace that Capstan acts as (impersonates) for what it does to the
	// deployment's objects in the cluster it runs in: the preflight's and
	// the plans' dry runs, applies, the reads of readiness checks, prunes,
	// deletions and drift corrections. It needs get, list, watch, create,
	// patch and delete on them. Empty: capstan run's
	// --default-service-account, or, without it, Capstan's own identity.
	// Stages that act on another cluster act as their kubeconfig's user.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// Report says where the deployment's progress is written back besides
	// its status (docs/report.md).
	// +optional
	Report *ReportSpec `json:"report,omitempty"`

	// Timeout bounds the fetch of the source and the render of one
	// reconcile, and each batch of API requests of a stage (an apply
	// wave, a look, a dry run): a source or a cluster that answers too
	// slowly fails that attempt with the reason and is retried with
	// backoff, without holding up any other deployment. It is not a stage
	// timeout (stages[].timeout): a stage still waits as long as it must.
	// Defaults to 3m.
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// Decryption decrypts the sops-encrypted files of the overlay in
	// memory, as they are rendered (docs/secrets.md). Empty: capstan
	// run's --decryption-secret for deployments of the root source, or no
	// key, in which case an encrypted file stalls the deployment before
	// anything is applied.
	// +optional
	Decryption *DecryptionSpec `json:"decryption,omitempty"`
}

// DecryptionProvider names the tool whose files a deployment decrypts.
// +kubebuilder:validation:Enum=sops
type DecryptionProvider string

// DecryptionSOPS decrypts files encrypted by sops (getsops/sops).
const DecryptionSOPS DecryptionProvider = "sops"

// DecryptedAnnotation marks an object rendered from a file Capstan
// decrypted. Diffs, status and reports treat it as a secret whatever its
// kind: its values are never shown.
const DecryptedAnnotation = "capstan.dev/decrypted"

// DecryptionSpec says how a deployment's encrypted files are decrypted.
type DecryptionSpec struct {
	// Provider is the encryption tool; only sops.
	// +kubebuilder:default=sops
	Provider DecryptionProvider `json:"provider"`

	// SecretRef names a Secret in the deployment's namespace holding the
	// private keys: age identities under keys ending in `.agekey`,
	// ASCII-armored OpenPGP private keys (no passphrase) under keys
	// ending in `.asc`. The keys never leave memory.
	SecretRef LocalObjectReference `json:"secretRef"`
}

// DefaultTimeout bounds a fetch, a render or a batch of API requests when
// ClusterDeploymentSpec.Timeout is not set.
const DefaultTimeout = 3 * time.Minute

// TimeoutOrDefault is spec.timeout, else DefaultTimeout.
func (s *ClusterDeploymentSpec) TimeoutOrDefault() time.Duration {
	if s.Timeout != nil && s.Timeout.Duration > 0 {
		return s.Timeout.Duration
	}
	return DefaultTimeout
}

// ReportSpec says where a deployment's progress is written back.
type ReportSpec struct {
	// GitStatus commits the deployment's status, as the file
	// status/<namespace>/<name>.yaml, to a branch of a git repository.
	// +optional
	GitStatus *GitStatusReport `json:"gitStatus,omitempty"`

	// PullRequests keeps one comment with the plan on each open pull
	// request against the branch the deployment reads, and after merge
	// follows the rollout in the same comment and in a commit status on
	// the merge commit (docs/forges.md).
	// +optional
	PullRequests *PullRequestReport `json:"pullRequests,omitempty"`
}

// ForgeProvider names the kind of forge pull requests live on.
// +kubebuilder:validation:Enum=github;gitea;gitlab
type ForgeProvider string

// Forge providers.
const (
	ForgeGitHub ForgeProvider = "github"
	ForgeGitea  ForgeProvider = "gitea"
	ForgeGitLab ForgeProvider = "gitlab"
)

// DefaultForgeTokenKey is the key of the Secret PullRequestReport.SecretRef
// names that holds the token.
const DefaultForgeTokenKey = "token"

// PullRequestReport says which forge and repository hold the pull requests
// of a deployment's source, and with which token Capstan comments on them
// and sets commit statuses.
// +kubebuilder:validation:XValidation:rule="self.provider != 'gitea' || has(self.baseURL)",message="a gitea forge needs baseURL: there is no default Gitea server"
type PullRequestReport struct {
	// Provider is the kind of forge: github, gitea or gitlab.
	Provider ForgeProvider `json:"provider"`

	// BaseURL is the forge's address, for GitHub Enterprise Server,
	// self-managed GitLab and Gitea (required there), e.g.
	// https://github.example.com. Empty means github.com or gitlab.com.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://[^\s/]+(/[^\s]*)?$`
	BaseURL string `json:"baseURL,omitempty"`

	// Repository is owner/name on GitHub and Gitea, the project's full
	// path (group/subgroup/name) on GitLab. Defaults to the path of
	// spec.source.git.url without .git.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+$`
	Repository string `json:"repository,omitempty"`

	// SecretRef names a Secret in the deployment's namespace whose key
	// `token` holds the forge token (scopes in docs/forges.md), and
	// `ca.crt` the PEM CA of a forge with a private CA. The token is
	// never written anywhere.
	SecretRef LocalObjectReference `json:"secretRef"`

	// StatusContext names the commit status on the merge commit, the
	// name a branch protection rule would require. Defaults to
	// capstan/<namespace>/<name>.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	StatusContext string `json:"statusContext,omitempty"`

	// Interval is how often the open pull requests are listed, besides
	// on push webhooks. Defaults to 1m.
	// +optional
	Interval *metav1.Duration `json:"interval,omitempty"`

	// Forks says what happens to pull requests whose head is a branch of
	// another repository (a fork): skip (the default) plans none of them,
	// unless the forge reports the author as the repository's owner, a
	// member or a collaborator, and leaves a one-line comment saying why;
	// plan plans them like branches of the repository (a dry run of a
	// stranger's change with the deployment's identity: docs/tenancy.md).
	// +optional
	// +kubebuilder:validation:Enum=skip;plan
	Forks ForkPolicy `json:"forks,omitempty"`

	// Values says whether plan comments show the old and new values of
	// changed fields (show) or only their paths (hide). Secret values are
	// never shown. Defaults to show for branches of the repository, whose
	// authors can push what Capstan applies, and hide for forks.
	// +optional
	// +kubebuilder:validation:Enum=show;hide
	Values ValuesPolicy `json:"values,omitempty"`

	// MaxPlansPerInterval bounds how many pull requests are planned
	// (fetched, rendered and dry-run) per Interval; the others wait for
	// a later interval, least recently planned first, and their comment
	// says they are queued. Defaults to 5.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	MaxPlansPerInterval int32 `json:"maxPlansPerInterval,omitempty"`
}

// ForkPolicy says whether pull requests from forks are planned.
type ForkPolicy string

// Fork policies.
const (
	ForksSkip ForkPolicy = "skip"
	ForksPlan ForkPolicy = "plan"
)

// ValuesPolicy says whether plan comments show changed values.
type ValuesPolicy string

// Values policies.
const (
	ValuesShow ValuesPolicy = "show"
	ValuesHide ValuesPolicy = "hide"
)

// DefaultMaxPlansPerInterval is PullRequestReport.MaxPlansPerInterval when
// it is not set.
const DefaultMaxPlansPerInterval = 5

// DefaultPullRequestInterval is how often open pull requests are listed
// when PullRequestReport.Interval is not set.
const DefaultPullRequestInterval = time.Minute

// DefaultStatusBranch is the branch status commits go to when
// GitStatusReport.Branch is empty.
const DefaultStatusBranch = "capstan/status"

// GitStatusReport says where status commits go. The branch is never one
// Capstan reads, so that a status commit cannot trigger a reconcile.
type GitStatusReport struct {
	// URL of the repository. Defaults to spec.source.git.url, or the root
	// source's URL for a deployment that reads the root source; required
	// for an OCI source.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	URL string `json:"url,omitempty"`

	// Branch the status commits go to. Defaults to capstan/status. It must
	// not be the branch the deployment (or any other) reads.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][A-Za-z0-9._/-]*$`
	Branch string `json:"branch,omitempty"`

	// Interval is the coalescing window: at most one commit per
	// deployment per interval. Defaults to 30s.
	// +optional
	Interval *metav1.Duration `json:"interval,omitempty"`

	// SecretRef names a Secret in the deployment's namespace with
	// credentials that may push: `username` and `password` (or a token)
	// and `ca.crt` (a private CA, PEM) for https, `identity` and
	// `known_hosts` for ssh. Defaults to spec.source.git.secretRef.
	// +optional
	SecretRef *LocalObjectReference `json:"secretRef,omitempty"`
}

// PruneSpec tunes pruning.
type PruneSpec struct {
	// Destructive allows pruning (and deleting, with deletionPolicy
	// Delete) objects of destructive kinds: those whose deletion destroys
	// machines or data, such as Cluster, BareMetalHost, Metal3Cluster,
	// Namespace and CustomResourceDefinition. Without it such objects are
	// kept and status.inventory.pendingPrune names them.
	// +optional
	Destructive bool `json:"destructive,omitempty"`
}

// DeletionPolicy is what deleting a ClusterDeployment does to what it applied.
type DeletionPolicy string

// Deletion policies.
const (
	DeletionPolicyDelete DeletionPolicy = "Delete"
	DeletionPolicyOrphan DeletionPolicy = "Orphan"
)

// DriftPolicy is what Capstan does about changes made to applied objects.
type DriftPolicy string

// Drift policies.
const (
	DriftCorrect DriftPolicy = "correct"
	DriftReport  DriftPolicy = "report"
	DriftIgnore  DriftPolicy = "ignore"
)

// KubeConfigReference says where a kubeconfig is read from: a Secret
// named outright, or the Secret Cluster API writes for a Cluster the
// deployment applies. Exactly one is set.
type KubeConfigReference struct {
	// SecretRef names the Secret, in the ClusterDeployment's namespace,
	// that holds the kubeconfig.
	// +optional
	SecretRef *SecretKeyReference `json:"secretRef,omitempty"`
	// Cluster names a Cluster API Cluster of the deployment: its
	// kubeconfig is the Secret <cluster>-kubeconfig, key value, in the
	// Cluster's namespace, which Cluster API writes once the control
	// plane is up. An empty name means the one Cluster the deployment
	// applies. This is how a profile says "the cluster being built".
	// +optional
	Cluster *ClusterKubeConfigReference `json:"cluster,omitempty"`
}

// ClusterKubeConfigReference names a Cluster API Cluster of the
// deployment.
type ClusterKubeConfigReference struct {
	// Name of the Cluster; empty means the only one the deployment applies.
	// +optional
	Name string `json:"name,omitempty"`
}

// SecretKeyReference names one key of a Secret in the same namespace.
type SecretKeyReference struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`

	// Key in the Secret's data. Defaults to value.
	// +optional
	Key string `json:"key,omitempty"`
}

// DefaultKubeConfigKey is the key of a kubeconfig Secret read when
// SecretKeyReference.Key is empty: the one Cluster API writes.
const DefaultKubeConfigKey = "value"

// SourceSpec names one source; exactly one field is set.
// +kubebuilder:validation:XValidation:rule="has(self.git) != has(self.oci)",message="set exactly one of git and oci"
type SourceSpec struct {
	// Git reads the overlay from a git repository.
	// +optional
	Git *GitSource `json:"git,omitempty"`

	// OCI reads the overlay from an OCI artifact, in the format `flux push
	// artifact` and `capstan push artifact` produce.
	// +optional
	OCI *OCISource `json:"oci,omitempty"`
}

// OCISource is an artifact in an OCI registry.
type OCISource struct {
	// URL of the repository: oci://host[:port]/path, without tag or digest.
	// +kubebuilder:validation:Pattern=`^oci://[^@?#]+$`
	URL string `json:"url"`

	// Ref selects the artifact. Defaults to the tag latest.
	// +optional
	Ref OCIRef `json:"ref,omitempty"`

	// SecretRef names a Secret in the deployment's namespace holding a
	// docker config under `.dockerconfigjson` (a
	// kubernetes.io/dockerconfigjson Secret) or `config.json`, and/or
	// `ca.crt`, the PEM CA of a registry with a private CA. Credential
	// helpers are not run.
	// +optional
	SecretRef *LocalObjectReference `json:"secretRef,omitempty"`

	// Insecure allows plain http to a registry that is not on loopback;
	// loopback registries are always reached over http.
	// +optional
	Insecure bool `json:"insecure,omitempty"`

	// Verify, when set, makes Capstan refuse an artifact without a valid
	// signature: nothing of it is rendered, and status says why.
	// +optional
	Verify *OCIVerify `json:"verify,omitempty"`
}

// OCIVerify says how an OCI artifact's signature is checked.
type OCIVerify struct {
	// Provider of the signatures: cosign, key-based, stored the way
	// `cosign sign --key` stores them (tag sha256-<digest>.sig).
	// +kubebuilder:validation:Enum=cosign
	// +kubebuilder:default=cosign
	// +optional
	Provider string `json:"provider,omitempty"`

	// SecretRef names a Secret in the deployment's namespace whose keys
	// ending in `.pub` hold PEM public keys (cosign.pub). One signature
	// made with one of them is enough.
	SecretRef LocalObjectReference `json:"secretRef"`
}

// OCIRef selects an artifact of an OCI repository; at most one field is
// set.
// +kubebuilder:validation:XValidation:rule="(has(self.tag) ? 1 : 0) + (has(self.semver) ? 1 : 0) + (has(self.digest) ? 1 : 0) <= 1",message="set at most one of tag, semver and digest"
type OCIRef struct {
	// Tag to follow, e.g. v1.4.0 or latest.
	// +optional
	Tag string `json:"tag,omitempty"`

	// SemVer follows the highest tag that is a semantic version within this
	// range, e.g. ">=1.2.0 <2.0.0".
	// +optional
	SemVer string `json:"semver,omitempty"`

	// Digest pins one manifest, e.g. sha256:4f2c...
	// +optional
	// +kubebuilder:validation:Pattern=`^sha256:[a-f0-9]{64}$`
	Digest string `json:"digest,omitempty"`
}

// GitSource is a branch of a git repository.
type GitSource struct {
	// URL of the repository: https://, http://, ssh://, git://, file:// or
	// the scp-like user@host:path.
	// +kubebuilder:validation:MinLength=1
	URL string `json:"url"`

	// Ref selects what to check out.
	// +optional
	Ref GitRef `json:"ref,omitempty"`

	// SecretRef names a Secret in the deployment's namespace with the
	// credentials: `username` and `password` (or a token as password) and
	// `ca.crt` (a private CA, PEM) for https, `identity` and
	// `known_hosts` for ssh.
	// +optional
	SecretRef *LocalObjectReference `json:"secretRef,omitempty"`

	// Verify, when set, makes Capstan refuse a head commit that is not
	// signed by one of the trusted keys: nothing of it is rendered, and
	// status says why.
	// +optional
	Verify *GitVerify `json:"verify,omitempty"`
}

// GitVerify names the keys that may sign the followed branch's commits.
type GitVerify struct {
	// SecretRef names a Secret in the deployment's namespace whose keys
	// ending in `.asc` hold ASCII-armored OpenPGP public keys and whose
	// keys ending in `.pub` (or named `authorized_keys`) hold SSH public
	// keys in authorized_keys format, for gpg.format=ssh signatures.
	SecretRef LocalObjectReference `json:"secretRef"`
}

// GitRef selects a revision of a git repository. At most one field is
// set; none follows the branch main.
// +kubebuilder:validation:XValidation:rule="(has(self.branch) ? 1 : 0) + (has(self.tag) ? 1 : 0) + (has(self.semver) ? 1 : 0) + (has(self.commit) ? 1 : 0) + (has(self.name) ? 1 : 0) <= 1",message="set at most one of branch, tag, semver, commit and name"
type GitRef struct {
	// Branch to follow. Defaults to main.
	// +optional
	Branch string `json:"branch,omitempty"`

	// Tag to follow, e.g. v1.2.3. The revision is the commit the tag
	// points at (an annotated tag's commit), shown as v1.2.3@sha1:<commit>.
	// +optional
	Tag string `json:"tag,omitempty"`

	// SemVer follows the highest tag that is a semantic version within
	// this range, e.g. ">=1.2.0 <2.0.0" or "~1.4"; other tags are ignored.
	// +optional
	SemVer string `json:"semver,omitempty"`

	// Commit pins one commit by its full 40-digit SHA-1. The deployment
	// never moves, and the repository is not polled once it is fetched.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9a-f]{40}$')",message="commit must be a full 40-digit lower-case SHA-1; short SHAs are not accepted"
	Commit string `json:"commit,omitempty"`

	// Name follows any ref by its full name, e.g. refs/pull/7/head.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.startsWith('refs/')",message="name must be a full ref name such as refs/pull/7/head"
	Name string `json:"name,omitempty"`
}

// DependencyReference names a ClusterDeployment.
type DependencyReference struct {
	// Name of the ClusterDeployment.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`

	// Namespace of the ClusterDeployment. Defaults to this one's.
	// +optional
	Namespace string `json:"namespace,omitempty"`
}

// LocalObjectReference names an object in the same namespace.
type LocalObjectReference struct {
	// Name of the object.
	Name string `json:"name"`
}

// StageAction is what a stage does with its objects.
// +kubebuilder:validation:Enum=apply;wait;validate;rollout;scale;pivot;delete
type StageAction string

const (
	// StageActionApply applies the stage's objects with server-side apply,
	// then waits until they are ready.
	StageActionApply StageAction = "apply"
	// StageActionWait applies nothing and waits until the selected objects,
	// applied by an earlier stage, are ready.
	StageActionWait StageAction = "wait"
	// StageActionValidate runs preflight checks over the rendered objects.
	StageActionValidate StageAction = "validate"
	// StageActionRollout deploys LCM machines in order and in batches.
	StageActionRollout StageAction = "rollout"
	// StageActionScale disables or enables controllers.
	StageActionScale StageAction = "scale"
	// StageActionPivot moves the cluster's objects into the cluster it built.
	StageActionPivot StageAction = "pivot"
	// StageActionDelete deletes the selected objects.
	StageActionDelete StageAction = "delete"
)

// StageSpec is one step of a plan.
type StageSpec struct {
	// Name identifies the stage in status, metrics and the
	// `capstan.dev/stage` label or annotation.
	// +kubebuilder:validation:Pattern=`^[A-Za-z][A-Za-z0-9-]{0,62}$`
	Name string `json:"name"`

	// Action is what the stage does. Defaults to apply.
	// +optional
	Action StageAction `json:"action,omitempty"`

	// Select picks the rendered objects that belong to this stage, in
	// addition to those labelled or annotated `capstan.dev/stage: <name>`.
	// +optional
	Select Selector `json:"select,omitempty"`

	// AllowEmpty lets the stage select no object, e.g. a profile's
	// workers stage for a cluster without workers. Without it, an apply,
	// wait, rollout, scale or delete stage that selects nothing is a
	// preflight error: most often a typo in select, or an object without
	// its capstan.dev/stage label. Validate and pivot stages act on the
	// whole plan and may always select nothing.
	// +optional
	AllowEmpty bool `json:"allowEmpty,omitempty"`

	// ReadyWhen lists checks that must all hold for the stage to be Ready.
	// Objects no check applies to are ready when kstatus says Current.
	// +optional
	ReadyWhen []ReadinessCheck `json:"readyWhen,omitempty"`

	// StuckAfter marks the stage stuck, for alerting, once it has been in
	// progress this long. The stage keeps retrying.
	// +optional
	StuckAfter *metav1.Duration `json:"stuckAfter,omitempty"`

	// Timeout, when set, fails the deployment (Stalled) once the stage has
	// been in progress this long. By default a stage never times out.
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// Scale configures a scale stage: the replica count it sets on the
	// selected Deployments and StatefulSets.
	// +optional
	Scale *ScaleSpec `json:"scale,omitempty"`

	// BootstrapKey, on an apply stage, gives the cluster Capstan's
	// bootstrap SSH key (seed 000's ClusterSSHConfigured): the key is
	// generated once into the Secret capstan-bootstrap-key of the
	// deployment's namespace, its public half is offered to the overlay as
	// ${CAPSTAN_BOOTSTRAP_SSH_KEY} (which some rendered object must use),
	// and the stage copies the key to the Secret bootstrap-key-<cluster>.
	// +optional
	BootstrapKey *BootstrapKeySpec `json:"bootstrapKey,omitempty"`

	// Rollout configures a rollout stage (LCM machines in order and in
	// batches).
	// +optional
	Rollout *RolloutSpec `json:"rollout,omitempty"`

	// KubeConfig, when set, makes this stage act on the cluster this
	// kubeconfig reaches; it overrides the deployment's kubeConfig.
	// +optional
	KubeConfig *KubeConfigReference `json:"kubeConfig,omitempty"`

	// Pivot tunes a pivot stage.
	// +optional
	Pivot *PivotSpec `json:"pivot,omitempty"`
}

// PivotSpec tunes how a pivot stage moves the deployment and hands it
// over (docs/pivot.md).
type PivotSpec struct {
	// Force moves even while machines are provisioning or hosts are being
	// registered, inspected or provisioned; without it the preflight
	// refuses, since a controller stopped mid-operation may leave a
	// machine half-built.
	// +optional
	Force bool `json:"force,omitempty"`
	// Install says whether this Capstan installs itself into the target
	// after the move: Auto (the default) installs it with the image this
	// instance runs and its source settings when it knows its image, and
	// otherwise waits for a Capstan there; Never always waits for one
	// (installed by other means, e.g. the target's Helm bundle).
	// +optional
	// +kubebuilder:validation:Enum=Auto;Never
	Install PivotInstall `json:"install,omitempty"`
}

// PivotInstall says whether a pivot installs Capstan into the target.
type PivotInstall string

// The install policies of a pivot.
const (
	PivotInstallAuto  PivotInstall = "Auto"
	PivotInstallNever PivotInstall = "Never"
)

// BootstrapKeySpec says where a stage copies the bootstrap SSH key.
type BootstrapKeySpec struct {
	// ClusterName names the copy, bootstrap-key-<clusterName>. Defaults to
	// the ClusterDeployment's name.
	// +optional
	ClusterName string `json:"clusterName,omitempty"`

	// Namespace of the copy. Defaults to the ClusterDeployment's namespace.
	// +optional
	Namespace string `json:"namespace,omitempty"`
}

// ScaleSpec is what a scale stage does to the workloads it selects: set
// one replica count, or give each workload back the count its repository
// commits.
// +kubebuilder:validation:XValidation:rule="!(has(self.committed) && self.committed) || !has(self.replicas)",message="scale.committed takes each workload's count from its rendered object: leave scale.replicas out"
// +kubebuilder:validation:XValidation:rule="(has(self.committed) && self.committed) || has(self.replicas)",message="a scale stage needs scale.replicas (0 disables, 1 or more enables) or scale.committed: true"
type ScaleSpec struct {
	// Replicas is set on every selected Deployment and StatefulSet: 0
	// disables a controller, 1 or more enables it.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`
	// Committed sets each selected workload's replicas back to the count
	// of its rendered object (its spec.replicas, 1 when it sets none):
	// it enables again, at the repository's count, a controller an
	// earlier scale stage disabled.
	// +optional
	Committed bool `json:"committed,omitempty"`
}

// Selector picks rendered objects. Every set field must match; within a
// list, any entry may match. An empty selector matches nothing.
type Selector struct {
	// Kinds matches the object kind, as `Kind` or `group/Kind`.
	// +optional
	Kinds []string `json:"kinds,omitempty"`

	// Names matches metadata.name.
	// +optional
	Names []string `json:"names,omitempty"`

	// LabelSelector matches labels.
	// +optional
	LabelSelector *metav1.LabelSelector `json:"labelSelector,omitempty"`
}

// ReadinessCheck is a CEL expression that must be true for every object of
// the stage it applies to. The object is bound to `object`.
type ReadinessCheck struct {
	// CEL is the expression, e.g. `object.status.infrastructureReady == true`.
	// +kubebuilder:validation:MinLength=1
	CEL string `json:"cel"`

	// Kind limits the check to objects of this kind (`Kind` or `group/Kind`).
	// +optional
	Kind string `json:"kind,omitempty"`

	// APIVersion is the group/version the check reads its objects in,
	// like `cluster.x-k8s.io/v1beta2`: the wait asks the API server for
	// each object in that version, and the server converts it (through the
	// provider's conversion webhook) from whichever served version the
	// overlay is written in. It needs Kind, in the same group. Empty: the
	// version the object is written in.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	APIVersion string `json:"apiVersion,omitempty"`

	// Message explains what is being waited for, shown while the check is false.
	// +optional
	Message string `json:"message,omitempty"`

	// MessageExpression is a CEL expression over `object` returning a
	// string that is appended to Message while the check is false: the
	// live detail, such as which machine or host holds the stage up. An
	// empty result, or one that fails to evaluate, adds nothing.
	// +optional
	MessageExpression string `json:"messageExpression,omitempty"`
}

// StageState is where a stage is in its life.
type StageState string

const (
	// StagePending has not started: an earlier stage is not Ready yet.
	StagePending StageState = "Pending"
	// StageInProgress has applied its objects and waits for them.
	StageInProgress StageState = "InProgress"
	// StageReady has all its checks holding for the recorded revision.
	StageReady StageState = "Ready"
	// StageFailed failed its last attempt; it is retried with backoff.
	StageFailed StageState = "Failed"
)

// StageStatus records one stage's progress.
type StageStatus struct {
	// Name of the stage.
	Name string `json:"name"`
	// State of the stage.
	State StageState `json:"state"`
	// Revision the stage was last worked on at.
	// +optional
	Revision string `json:"revision,omitempty"`
	// StartedAt is when the stage first left Pending for this revision.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// AppliedAt is when the stage's objects were applied at this revision.
	// A stage in progress with AppliedAt set only waits on the next attempt.
	// +optional
	AppliedAt *metav1.Time `json:"appliedAt,omitempty"`
	// FinishedAt is when the stage became Ready.
	// +optional
	FinishedAt *metav1.Time `json:"finishedAt,omitempty"`
	// Attempts counts the attempts at this revision: the first, and one
	// more each time the stage starts over after a failure. Waiting for
	// readiness is one attempt, however long it takes.
	// +optional
	Attempts int32 `json:"attempts,omitempty"`
	// Objects is how many rendered objects belong to the stage.
	// +optional
	Objects int32 `json:"objects,omitempty"`
	// Message says what the stage waits for or why it failed.
	// +optional
	Message string `json:"message,omitempty"`
	// Stuck is set once the stage has been in progress longer than stuckAfter.
	// +optional
	Stuck bool `json:"stuck,omitempty"`
	// Progress counts what the stage has done of what it must do, when
	// the executor knows: objects ready, machines upgraded.
	// +optional
	Progress *StageProgress `json:"progress,omitempty"`
}

// Condition types, following the kstatus conventions.
const (
	// ConditionReady is True once every stage is Ready at the current revision.
	ConditionReady = "Ready"
	// ConditionReconciling is True while stages are being worked on.
	ConditionReconciling = "Reconciling"
	// ConditionStalled is True when progress needs a human: bad input, a
	// missing CRD, a hard timeout.
	ConditionStalled = "Stalled"
	// ConditionSourceReady is False while the source cannot be read (an
	// outage, refused credentials, a refused artifact); its reason says
	// why. Ready keeps describing what was applied meanwhile.
	ConditionSourceReady = "SourceReady"
)

// ClusterDeploymentStatus is what the reconciler observed and did.
type ClusterDeploymentStatus struct {
	// ObservedGeneration is the generation last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Revision is the source revision the stages below refer to.
	// +optional
	Revision string `json:"revision,omitempty"`
	// CurrentStage is the first stage that is not Ready.
	// +optional
	CurrentStage string `json:"currentStage,omitempty"`
	// Stages holds one entry per stage of the plan, in plan order.
	// +optional
	Stages []StageStatus `json:"stages,omitempty"`
	// Conditions are Ready, Reconciling and Stalled.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Pivot records the move of this deployment into another cluster by a
	// pivot stage, one phase at a time, so that a move interrupted at any
	// point resumes where it was (docs/pivot.md).
	// +optional
	Pivot *PivotStatus `json:"pivot,omitempty"`
	// Inventory lists every object this deployment applied, by stage, so
	// that objects its source drops are pruned and drift is watched.
	// +optional
	Inventory *Inventory `json:"inventory,omitempty"`
	// Preflight is what the preflight checks found in the revision they
	// last checked, every problem, when they found any (docs/validation.md).
	// The Ready and Stalled conditions show the first of them.
	// +optional
	Preflight *PreflightStatus `json:"preflight,omitempty"`
	// LastHandledReconcileAt is the value of the annotation
	// capstan.dev/reconcile-requested-at that the last finished reconcile
	// answered (`capstan reconcile` waits for it).
	// +optional
	LastHandledReconcileAt string `json:"lastHandledReconcileAt,omitempty"`
	// Summary is the status in the short form kubectl's columns and
	// `capstan get` show, derived from the fields above with every
	// status write.
	// +optional
	Summary *StatusSummary `json:"summary,omitempty"`
}

// Inventory is what a deployment applied, one group per stage in plan
// order, compactly (like Flux's).
type Inventory struct {
	// Stages holds the applied objects of each apply stage.
	// +optional
	Stages []InventoryStage `json:"stages,omitempty"`
	// PendingPrune lists the objects the source no longer declares that
	// are kept because pruning them needs spec.prune.destructive, by
	// the same ID as the entries.
	// +optional
	PendingPrune []string `json:"pendingPrune,omitempty"`
}

// InventoryStage is the objects one stage applied, on one cluster.
type InventoryStage struct {
	// Name is the stage's name.
	Name string `json:"name"`
	// KubeConfig is the kubeconfig Secret the stage's cluster was reached
	// through, when it is not the one Capstan runs in.
	// +optional
	KubeConfig *SecretKeyReference `json:"kubeConfig,omitempty"`
	// KubeConfigNamespace is the namespace of that Secret.
	// +optional
	KubeConfigNamespace string `json:"kubeConfigNamespace,omitempty"`
	// Entries are the stage's objects.
	// +optional
	Entries []InventoryEntry `json:"entries,omitempty"`
}

// InventoryEntry is one applied object.
type InventoryEntry struct {
	// ID is namespace_name_group_kind (cli-utils' ObjMetadata form).
	ID string `json:"id"`
	// Version is the API version it was applied with.
	Version string `json:"v"`
}

// PivotPhase is how far a move has come. The phases run in the order
// below; each is recorded once done.
type PivotPhase string

// The phases of a move.
const (
	// PivotPreflight: the move was checked and may start.
	PivotPreflight PivotPhase = "Preflight"
	// PivotPaused: the source's Clusters, hosts and the deployment are paused.
	PivotPaused PivotPhase = "Pause"
	// PivotCopied: every object exists in the target.
	PivotCopied PivotPhase = "Copy"
	// PivotUnpaused: the target owns the deployment (fencing record) and
	// its controllers act.
	PivotUnpaused PivotPhase = "Unpause"
	// PivotSourceCleaned: the source keeps only the read-only mirrors.
	PivotSourceCleaned PivotPhase = "CleanSource"
	// PivotInstalled: Capstan is installed in the target (or an instance
	// already runs there).
	PivotInstalled PivotPhase = "Install"
	// PivotHandedOver: the Capstan of the target leads and has taken the
	// deployment over.
	PivotHandedOver PivotPhase = "Handover"
	// PivotCleanedUp: what the deployment marks bootstrap-only is gone
	// from the source; the move is complete.
	PivotCleanedUp PivotPhase = "Cleanup"
)

// PivotPhases are the phases of a move, in order.
var PivotPhases = []PivotPhase{
	PivotPreflight, PivotPaused, PivotCopied, PivotUnpaused,
	PivotSourceCleaned, PivotInstalled, PivotHandedOver, PivotCleanedUp,
}

// Reached reports whether phase p is done when last is the last phase
// done ("" before the first).
func (last PivotPhase) Reached(p PivotPhase) bool {
	if last == "" {
		return false
	}
	return slices.Index(PivotPhases, last) >= slices.Index(PivotPhases, p)
}

// PivotStatus is the record of a move.
type PivotStatus struct {
	// Target names the cluster the deployment moves into: the kubeconfig
	// Secret of the pivot stage, as namespace/name.
	// +optional
	Target string `json:"target,omitempty"`
	// Stage is the pivot stage that moves the deployment.
	// +optional
	Stage string `json:"stage,omitempty"`
	// KubeConfig is where the target's kubeconfig is read from (the
	// mirrors' status is refreshed through it).
	// +optional
	KubeConfig *SecretKeyReference `json:"kubeConfig,omitempty"`
	// KubeConfigNamespace is the namespace of that Secret when it is not
	// the deployment's own (the Cluster's namespace).
	// +optional
	KubeConfigNamespace string `json:"kubeConfigNamespace,omitempty"`
	// Phase is the last phase done; empty before the first.
	// +optional
	Phase PivotPhase `json:"phase,omitempty"`
	// StartedAt is when the move started; PhaseTime when Phase was reached.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// +optional
	PhaseTime *metav1.Time `json:"phaseTime,omitempty"`
	// Objects is how many objects the move copied into the target.
	// +optional
	Objects int32 `json:"objects,omitempty"`
	// Mirrors are the read-only copies kept in the source, whose status
	// follows the target's.
	// +optional
	Mirrors []ObjectReference `json:"mirrors,omitempty"`
	// Owner identifies the Capstan that owns the deployment once handed
	// over: the UID of the target's kube-system namespace.
	// +optional
	Owner string `json:"owner,omitempty"`
	// MirroredAt is when the mirrors' status was last refreshed.
	// +optional
	MirroredAt *metav1.Time `json:"mirroredAt,omitempty"`
	// Message says what the move waits for, or its last error.
	// +optional
	Message string `json:"message,omitempty"`
}

// ObjectReference names one object by its API group, kind, namespace and
// name.
type ObjectReference struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// +optional
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
}

// ClusterDeployment is one cluster's desired state and rollout progress.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=cd;cds,categories=capstan
// +kubebuilder:printcolumn:name="Revision",type=string,JSONPath=`.status.summary.revision`
// +kubebuilder:printcolumn:name="Suspended",type=boolean,JSONPath=`.spec.suspend`,priority=1
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Stage",type=string,JSONPath=`.status.summary.stage`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.summary.message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ClusterDeployment struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ClusterDeploymentSpec   `json:"spec,omitempty"`
	Status ClusterDeploymentStatus `json:"status,omitempty"`
}

// ClusterDeploymentList is a list of ClusterDeployments.
//
// +kubebuilder:object:root=true
type ClusterDeploymentList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterDeployment `json:"items"`
}

// PreflightStatus is what the preflight checks found in one revision.
type PreflightStatus struct {
	// Revision is the revision checked.
	Revision string `json:"revision"`
	// Errors and Warnings count the problems; an error stops the
	// revision before anything is applied, a warning does not.
	Errors   int32 `json:"errors"`
	Warnings int32 `json:"warnings"`
	// Problems lists the problems in plan order, at most 200.
	// +optional
	// +kubebuilder:validation:MaxItems=200
	Problems []PreflightProblem `json:"problems,omitempty"`
}

// PreflightProblem is one thing preflight found wrong with a revision.
type PreflightProblem struct {
	// Severity is Error or Warning.
	// +kubebuilder:validation:Enum=Error;Warning
	Severity string `json:"severity"`
	// Object names the object as `Kind namespace/name`, or the stage as
	// `stage Name`.
	Object string `json:"object"`
	// Field is the path of the offending field, e.g. apiVersion or
	// metadata.namespace.
	// +optional
	Field string `json:"field,omitempty"`
	// Message says what is wrong, how to fix it, and the file, when known.
	Message string `json:"message"`
}
