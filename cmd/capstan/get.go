package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// getFlags are the flags of `capstan get`.
type getFlags struct {
	scope scopeFlags
	out   outputFlags
}

func (f *getFlags) BindFlags(fs *pflag.FlagSet) {
	f.scope.BindFlags(fs, true)
	f.out.BindFlags(fs, "source, age, full revisions and whole messages")
}

func newGetCommand() *cobra.Command {
	var cluster clusterFlags
	var f getFlags
	cmd := &cobra.Command{
		Use:   "get [NAME]",
		Short: "List ClusterDeployments, one line each: revision, suspended, ready, stage, message",
		Long: `Get prints one line per ClusterDeployment: its revision (short, as
main@sha1:1a2b3c4d), whether it is suspended, whether it is Ready, the stage
it is at with the stages Ready out of all, how long ago its readiness last
changed, and why it is not Ready. The message is cut to the terminal's
width (80 columns when stdout is not a terminal; --width sets it).
-o wide adds the source and the age and shows full revisions; -o yaml|json
prints the same fields for scripts.`,
		Example: `  capstan get -A
  capstan get mgmt-east -n capstan-system -o wide
  capstan get -A -o json | jq -r '.[] | select(.ready != "True") | .name'`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.out.validate(); err != nil {
				return err
			}
			ns, err := f.scope.resolve(&cluster)
			if err != nil {
				return err
			}
			if len(args) == 1 && ns == "" {
				return errors.New("NAME needs a namespace: use -n, not -A")
			}
			c, err := cluster.client()
			if err != nil {
				return err
			}
			s := &statusCommand{client: c, namespace: ns}
			if len(args) == 1 {
				s.name = args[0]
			}
			list := &capstanv1.ClusterDeploymentList{}
			if err := c.List(cmd.Context(), list, s.listOptions()...); err != nil {
				return fmt.Errorf("list ClusterDeployments %s: %w", s.where(), err)
			}
			if s.name != "" && len(list.Items) == 0 {
				return fmt.Errorf("ClusterDeployment %s/%s not found", ns, s.name)
			}
			out := cmd.OutOrStdout()
			if len(list.Items) == 0 && !f.out.structured() {
				fmt.Fprintf(cmd.ErrOrStderr(), "No ClusterDeployments %s.\n", s.where())
				return nil
			}
			sortDeployments(list.Items)
			rows := getRows(list.Items)
			if f.out.structured() {
				data, err := encode(rows, f.out.output)
				if err != nil {
					return err
				}
				_, err = out.Write(data)
				return err
			}
			v := f.out.view(out)
			v.now = time.Now()
			_, err = io.WriteString(out, v.renderGet(rows, ns == ""))
			return err
		},
	}
	cluster.BindFlags(cmd.Flags())
	f.BindFlags(cmd.Flags())
	return cmd
}

// getRow is one deployment as `capstan get` shows it; -o json|yaml prints
// these fields.
type getRow struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Revision is the full revision; the table shortens it.
	Revision  string `json:"revision,omitempty"`
	Suspended bool   `json:"suspended"`
	// Ready is the Ready condition as kubectl wait reads it: True, False,
	// or Unknown while a new generation or revision is rolling out.
	Ready        string `json:"ready"`
	Phase        string `json:"phase"`
	CurrentStage string `json:"currentStage,omitempty"`
	// StagesReady and StagesTotal count the stages of this revision's
	// walk; both are 0 when a failure stopped it before the first.
	StagesReady int `json:"stagesReady"`
	StagesTotal int `json:"stagesTotal"`
	// Stage is the STAGE column: "WorkersReady 4/6", "6/6", "-".
	Stage string `json:"stage"`
	// Progress is how far the current stage is, when it counts.
	Progress *capstanv1.StageProgress `json:"progress,omitempty"`
	// LastChange is when readiness last changed.
	LastChange *metav1.Time `json:"lastChange,omitempty"`
	Created    metav1.Time  `json:"created"`
	Source     string       `json:"source"`
	Message    string       `json:"message,omitempty"`
}

func getRows(items []capstanv1.ClusterDeployment) []getRow {
	rows := make([]getRow, len(items))
	for i := range items {
		cd := &items[i]
		p := phase(cd)
		r := getRow{
			Namespace: cd.Namespace, Name: cd.Name, Revision: cd.Status.Revision, Suspended: cd.Spec.Suspend,
			Ready: "Unknown", Phase: p, Stage: cd.Status.StageText(),
			Created: cd.CreationTimestamp, Source: sourceText(cd),
		}
		if cd.Status.StagesCurrent() {
			r.CurrentStage = cd.Status.CurrentStage
			r.StagesReady, r.StagesTotal = cd.Status.StagesReady(), len(cd.Status.Stages)
			if st := stageNamed(cd, r.CurrentStage); st != nil && st.State != capstanv1.StageReady {
				r.Progress = st.Progress
			}
		}
		c := meta.FindStatusCondition(cd.Status.Conditions, capstanv1.ConditionReady)
		if c != nil {
			if !c.LastTransitionTime.IsZero() {
				t := c.LastTransitionTime
				r.LastChange = &t
			}
			switch {
			case c.Status == metav1.ConditionTrue && p == phaseReady, p == phaseSuspended:
				r.Ready = string(c.Status)
			case p == phaseStalled || p == phaseRetrying:
				r.Ready = string(metav1.ConditionFalse)
			}
		}
		switch {
		case p == phaseReady && sourceLine(cd, p) != "":
			r.Message = sourceLine(cd, p)
		case p == phaseReady && c != nil:
			r.Message = oneLine(c.Message)
		case p == phaseSuspended:
			r.Message = "suspended: nothing is fetched or applied until capstan resume " + cd.Name
		default:
			r.Message = reasonLine(cd, p)
		}
		rows[i] = r
	}
	return rows
}

// sourceText names what a deployment reads: "<url>@<ref>", or the
// daemon's root source.
func sourceText(cd *capstanv1.ClusterDeployment) string {
	src := cd.Spec.Source
	switch {
	case src == nil:
		return "root source"
	case src.Git != nil:
		r := src.Git.Ref
		for _, ref := range []string{r.Tag, r.SemVer, r.Commit, r.Name, r.Branch} {
			if ref != "" {
				return src.Git.URL + "@" + ref
			}
		}
		return src.Git.URL + "@main"
	case src.OCI != nil:
		r := src.OCI.Ref
		for _, ref := range []string{r.Tag, r.SemVer, r.Digest} {
			if ref != "" {
				return src.OCI.URL + "@" + ref
			}
		}
		return src.OCI.URL
	}
	return ""
}

// renderGet draws `capstan get`: one line per deployment, the columns as
// wide as their widest cell and the message in what is left of the
// width. When that is less than minGetMessage, the stage, name and
// namespace columns give up room, in that order; with fewer than
// minMessage columns left the message is left out (-o wide, -o yaml and
// capstan status show it). -o wide adds the source and the age, and
// prints full revisions and whole messages, past the width.
func (v view) renderGet(rows []getRow, namespaces bool) string {
	t := &textTable{room: minGetMessage, dropBelow: minMessage}
	if v.wide {
		t.last = lastFull
	}
	cell := func(c *column, f func(getRow) string) {
		for _, r := range rows {
			c.cells = append(c.cells, f(r))
		}
	}
	if namespaces {
		cell(t.add(&column{header: "NAMESPACE", min: 9}), func(r getRow) string { return r.Namespace })
		t.shrink = append(t.shrink, 0)
	}
	cell(t.add(&column{header: "NAME", min: 12}), func(r getRow) string { return r.Name })
	name := len(t.cols) - 1
	cell(t.add(&column{header: "REVISION"}), func(r getRow) string {
		if v.wide {
			return orDash(r.Revision)
		}
		return orDash(formatRevision(r.Revision))
	})
	if v.wide {
		cell(t.add(&column{header: "SOURCE"}), func(r getRow) string { return orDash(r.Source) })
	}
	cell(t.add(&column{header: "SUSPENDED"}), func(r getRow) string {
		if r.Suspended {
			return "True"
		}
		return "False"
	})
	cell(t.add(&column{header: "READY"}), func(r getRow) string { return r.Ready })
	cell(t.add(&column{header: "STAGE", min: 5, cut: cutStage}), func(r getRow) string { return r.Stage })
	t.shrink = append([]int{len(t.cols) - 1, name}, t.shrink...)
	cell(t.add(&column{header: "CHANGED"}), func(r getRow) string {
		if r.LastChange == nil {
			return "-"
		}
		return duration.HumanDuration(v.now.Sub(r.LastChange.Time))
	})
	if v.wide {
		cell(t.add(&column{header: "AGE"}), func(r getRow) string {
			if r.Created.IsZero() {
				return "-"
			}
			return duration.HumanDuration(v.now.Sub(r.Created.Time))
		})
	}
	cell(t.add(&column{header: "MESSAGE"}), func(r getRow) string { return r.Message })
	return t.render(v)
}

// minGetMessage is the message width the stage, name and namespace
// columns of `capstan get` are cut for.
const minGetMessage = 20

// cutStage shortens a STAGE cell to w, keeping its "n/m" whole.
func cutStage(s string, w int) string {
	if utf8.RuneCountInString(s) <= w {
		return s
	}
	i := strings.LastIndexByte(s, ' ')
	if i < 0 {
		return fit(s, w)
	}
	counts := s[i:]
	if w < len(counts)+2 {
		return counts[1:] // no room for a useful part of the name
	}
	return fit(s[:i], w-len(counts)) + counts
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
