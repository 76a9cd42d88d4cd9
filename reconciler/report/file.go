package report

import (
	"bytes"
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// Path returns where the status file of a deployment lives in the status
// branch.
func Path(namespace, name string) string {
	return "status/" + namespace + "/" + name + ".yaml"
}

// FileKind is the kind of a status file.
const FileKind = "ClusterDeploymentStatus"

// File is the content of a status file: what a person reading the status
// branch needs, in a fixed key order, and nothing that changes while the
// status does not (no time of writing), so that an unchanged status makes
// no commit.
type File struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Metadata   FileMeta `yaml:"metadata"`
	// Phase sums the status up: Ready, Progressing, Failed (a stage's
	// last attempt failed; it is retried), Stalled (needs a new commit or
	// spec) or Deleting.
	Phase              string `yaml:"phase"`
	Revision           string `yaml:"revision,omitempty"`
	ObservedGeneration int64  `yaml:"observedGeneration,omitempty"`
	CurrentStage       string `yaml:"currentStage,omitempty"`
	// Message is the Ready condition's message.
	Message    string          `yaml:"message,omitempty"`
	Stages     []FileStage     `yaml:"stages,omitempty"`
	Conditions []FileCondition `yaml:"conditions,omitempty"`
	Pivot      *FilePivot      `yaml:"pivot,omitempty"`
}

// FileMeta names the deployment.
type FileMeta struct {
	Name      string `yaml:"name"`
	Namespace string `yaml:"namespace"`
}

// FileStage is one stage of the plan.
type FileStage struct {
	Name       string `yaml:"name"`
	State      string `yaml:"state"`
	StartedAt  string `yaml:"startedAt,omitempty"`
	FinishedAt string `yaml:"finishedAt,omitempty"`
	Attempts   int32  `yaml:"attempts,omitempty"`
	Objects    int32  `yaml:"objects,omitempty"`
	Stuck      bool   `yaml:"stuck,omitempty"`
	Message    string `yaml:"message,omitempty"`
}

// FileCondition is one of the Ready, Reconciling and Stalled conditions.
type FileCondition struct {
	Type               string `yaml:"type"`
	Status             string `yaml:"status"`
	Reason             string `yaml:"reason,omitempty"`
	Message            string `yaml:"message,omitempty"`
	LastTransitionTime string `yaml:"lastTransitionTime,omitempty"`
}

// FilePivot is the record of a move into another cluster.
type FilePivot struct {
	Phase     string `yaml:"phase,omitempty"`
	Stage     string `yaml:"stage,omitempty"`
	Target    string `yaml:"target,omitempty"`
	StartedAt string `yaml:"startedAt,omitempty"`
	PhaseTime string `yaml:"phaseTime,omitempty"`
	Objects   int32  `yaml:"objects,omitempty"`
	Message   string `yaml:"message,omitempty"`
}

// The phases of a status file.
const (
	PhaseReady       = "Ready"
	PhaseProgressing = "Progressing"
	PhaseFailed      = "Failed"
	PhaseStalled     = "Stalled"
	PhaseDeleting    = "Deleting"
)

// conditionOrder is the order conditions are written in.
var conditionOrder = []string{capstanv1.ConditionReady, capstanv1.ConditionReconciling, capstanv1.ConditionStalled}

// NewFile returns the status file of cd. Messages are taken as the
// reconciler wrote them (URL credentials already redacted); Scrub removes
// Secret values.
func NewFile(cd *capstanv1.ClusterDeployment) File {
	st := &cd.Status
	f := File{
		APIVersion:         capstanv1.GroupVersion.String(),
		Kind:               FileKind,
		Metadata:           FileMeta{Name: cd.Name, Namespace: cd.Namespace},
		Phase:              phase(cd),
		Revision:           st.Revision,
		ObservedGeneration: st.ObservedGeneration,
		CurrentStage:       st.CurrentStage,
	}
	if c := meta.FindStatusCondition(st.Conditions, capstanv1.ConditionReady); c != nil {
		f.Message = c.Message
	}
	for _, s := range st.Stages {
		f.Stages = append(f.Stages, FileStage{
			Name: s.Name, State: string(s.State), StartedAt: timeString(s.StartedAt), FinishedAt: timeString(s.FinishedAt),
			Attempts: s.Attempts, Objects: s.Objects, Stuck: s.Stuck, Message: s.Message,
		})
	}
	for _, typ := range conditionOrder {
		if c := meta.FindStatusCondition(st.Conditions, typ); c != nil {
			f.Conditions = append(f.Conditions, FileCondition{
				Type: c.Type, Status: string(c.Status), Reason: c.Reason, Message: c.Message,
				LastTransitionTime: timeString(&c.LastTransitionTime),
			})
		}
	}
	if p := st.Pivot; p != nil {
		f.Pivot = &FilePivot{
			Phase: string(p.Phase), Stage: p.Stage, Target: p.Target, StartedAt: timeString(p.StartedAt),
			PhaseTime: timeString(p.PhaseTime), Objects: p.Objects, Message: p.Message,
		}
	}
	return f
}

func phase(cd *capstanv1.ClusterDeployment) string {
	conds := cd.Status.Conditions
	switch {
	case !cd.DeletionTimestamp.IsZero():
		return PhaseDeleting
	case meta.IsStatusConditionTrue(conds, capstanv1.ConditionStalled):
		return PhaseStalled
	case meta.IsStatusConditionTrue(conds, capstanv1.ConditionReady):
		return PhaseReady
	}
	for _, s := range cd.Status.Stages {
		if s.State == capstanv1.StageFailed {
			return PhaseFailed
		}
	}
	return PhaseProgressing
}

func timeString(t *metav1.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// Scrub returns f with clean applied to every string that comes from the
// deployment's status.
func (f File) Scrub(clean func(string) string) File {
	f.Revision, f.CurrentStage, f.Message = clean(f.Revision), clean(f.CurrentStage), clean(f.Message)
	f.Stages = append([]FileStage(nil), f.Stages...)
	for i := range f.Stages {
		f.Stages[i].Message = clean(f.Stages[i].Message)
	}
	f.Conditions = append([]FileCondition(nil), f.Conditions...)
	for i := range f.Conditions {
		c := &f.Conditions[i]
		c.Reason, c.Message = clean(c.Reason), clean(c.Message)
	}
	if f.Pivot != nil {
		p := *f.Pivot
		p.Target, p.Message = clean(p.Target), clean(p.Message)
		f.Pivot = &p
	}
	return f
}

// Marshal renders f as YAML under a comment that says where it comes from.
func (f File) Marshal() ([]byte, error) {
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# Status of ClusterDeployment %s/%s, written by Capstan at each change.\n"+
		"# Do not edit: the next change overwrites this file.\n", f.Metadata.Namespace, f.Metadata.Name)
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(f); err != nil {
		return nil, fmt.Errorf("render status file of %s/%s: %w", f.Metadata.Namespace, f.Metadata.Name, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("render status file of %s/%s: %w", f.Metadata.Namespace, f.Metadata.Name, err)
	}
	return buf.Bytes(), nil
}
