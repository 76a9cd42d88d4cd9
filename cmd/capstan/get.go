package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// defaultGetWidth is the width of `capstan get` when stdout is not a
// terminal and --width is not given.
const defaultGetWidth = 80

// getFlags are the flags of `capstan get`.
type getFlags struct {
	scope     scopeFlags
	output    string
	noHeaders bool
	width     int
}

func (f *getFlags) BindFlags(fs *pflag.FlagSet) {
	f.scope.BindFlags(fs, true)
	fs.StringVarP(&f.output, "output", "o", "", "output format: wide (more columns, full revisions), yaml or json")
	fs.BoolVar(&f.noHeaders, "no-headers", false, "print no header line")
	fs.IntVar(&f.width, "width", 0, "width of the table in columns (default: the terminal's, else 80)")
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
			switch f.output {
			case "", "wide", "yaml", "json":
			default:
				return fmt.Errorf("--output %q: expected wide, yaml or json", f.output)
			}
			if f.width < 0 {
				return fmt.Errorf("--width %d: must be positive", f.width)
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
			if len(list.Items) == 0 && (f.output == "" || f.output == "wide") {
				fmt.Fprintf(cmd.ErrOrStderr(), "No ClusterDeployments %s.\n", s.where())
				return nil
			}
			sortDeployments(list.Items)
			rows := getRows(list.Items)
			switch f.output {
			case "yaml", "json":
				data, err := encodeRows(rows, f.output)
				if err != nil {
					return err
				}
				_, err = out.Write(data)
				return err
			}
			t := getTable{now: time.Now(), width: getWidth(out, f.width), wide: f.output == "wide",
				namespaces: ns == "", noHeaders: f.noHeaders}
			_, err = io.WriteString(out, t.render(rows))
			return err
		},
	}
	cluster.BindFlags(cmd.Flags())
	f.BindFlags(cmd.Flags())
	return cmd
}

// getWidth is flag when set, else the terminal's width when out is one,
// else defaultGetWidth.
func getWidth(out io.Writer, flag int) int {
	if flag > 0 {
		return flag
	}
	if file, ok := out.(*os.File); ok && term.IsTerminal(int(file.Fd())) {
		if w, _, err := term.GetSize(int(file.Fd())); err == nil && w > 0 {
			return w
		}
	}
	return defaultGetWidth
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
	StagesReady  int    `json:"stagesReady"`
	StagesTotal  int    `json:"stagesTotal"`
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
			Ready: "Unknown", Phase: p, CurrentStage: cd.Status.CurrentStage,
			StagesReady: ready(cd), StagesTotal: len(cd.Status.Stages),
			Created: cd.CreationTimestamp, Source: sourceText(cd),
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

// stageText is the STAGE column: the current stage and the stages Ready
// out of all, "-" before there is a plan.
func (r getRow) stageText() string {
	if r.StagesTotal == 0 {
		return "-"
	}
	n := fmt.Sprintf("%d/%d", r.StagesReady, r.StagesTotal)
	if r.CurrentStage == "" || r.StagesReady == r.StagesTotal {
		return n
	}
	return r.CurrentStage + " " + n
}

func encodeRows(rows []getRow, format string) ([]byte, error) {
	if format == "yaml" {
		return yaml.Marshal(rows)
	}
	// Ranges such as ">=1.0.0" stay readable: no HTML escaping.
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	err := enc.Encode(rows)
	return b.Bytes(), err
}

// getTable draws `capstan get`: columns as wide as their widest cell, and
// the message in what is left of width. When that is too little, the
// stage and the name columns give up room first.
type getTable struct {
	now        time.Time
	width      int
	wide       bool
	namespaces bool // a NAMESPACE column, for -A
	noHeaders  bool
}

// The message wants minGetMessage columns, and the stage, name and
// namespace columns are cut for it. It gets what remains of the width;
// with fewer than minMessage columns left it is left out: -o wide, -o
// yaml and capstan status show it.
const minGetMessage = 20

// getColumn is one column: its cells, and how it gives up room.
type getColumn struct {
	header string
	cells  []string
	// min is the narrowest the column may be cut to; 0 never cuts it.
	min int
	cut func(s string, w int) string
}

func (t getTable) render(rows []getRow) string {
	var cols []*getColumn
	add := func(header string, min int, cut func(string, int) string, cell func(getRow) string) {
		c := &getColumn{header: header, min: min, cut: cut}
		for _, r := range rows {
			c.cells = append(c.cells, cell(r))
		}
		cols = append(cols, c)
	}
	if t.namespaces {
		add("NAMESPACE", 9, fit, func(r getRow) string { return r.Namespace })
	}
	add("NAME", 12, fit, func(r getRow) string { return r.Name })
	add("REVISION", 0, nil, func(r getRow) string {
		rev := r.Revision
		if !t.wide {
			rev = formatRevision(rev)
		}
		return orDash(rev)
	})
	if t.wide {
		add("SOURCE", 0, nil, func(r getRow) string { return orDash(r.Source) })
	}
	add("SUSPENDED", 0, nil, func(r getRow) string {
		if r.Suspended {
			return "True"
		}
		return "False"
	})
	add("READY", 0, nil, func(r getRow) string { return r.Ready })
	add("STAGE", 5, cutStage, func(r getRow) string { return r.stageText() })
	add("CHANGED", 0, nil, func(r getRow) string {
		if r.LastChange == nil {
			return "-"
		}
		return duration.HumanDuration(t.now.Sub(r.LastChange.Time))
	})
	if t.wide {
		add("AGE", 0, nil, func(r getRow) string {
			if r.Created.IsZero() {
				return "-"
			}
			return duration.HumanDuration(t.now.Sub(r.Created.Time))
		})
	}

	widths := make([]int, len(cols))
	used := 0
	for i, c := range cols {
		widths[i] = len(c.header)
		for _, s := range c.cells {
			widths[i] = max(widths[i], utf8.RuneCountInString(s))
		}
		used += widths[i] + len(colGap)
	}
	msgW := t.width - used
	// Too little room for the message: cut the columns that allow it,
	// the stage first, then the name, then the namespace.
	for _, name := range []string{"STAGE", "NAME", "NAMESPACE"} {
		for i, c := range cols {
			if c.header != name || msgW >= minGetMessage || widths[i] <= c.min {
				continue
			}
			give := min(minGetMessage-msgW, widths[i]-c.min)
			widths[i] -= give
			msgW += give
		}
	}
	showMessage := msgW >= minMessage

	var b strings.Builder
	line := func(cells []string, msg string) {
		var l strings.Builder
		for i, s := range cells {
			if c := cols[i]; c.cut != nil {
				s = c.cut(s, widths[i])
			}
			l.WriteString(pad(s, widths[i]) + colGap)
		}
		if showMessage {
			l.WriteString(fit(msg, msgW))
		}
		b.WriteString(strings.TrimRight(l.String(), " ") + "\n")
	}
	if !t.noHeaders {
		heads := make([]string, len(cols))
		for i, c := range cols {
			heads[i] = c.header
		}
		line(heads, "MESSAGE")
	}
	for r := range rows {
		cells := make([]string, len(cols))
		for i, c := range cols {
			cells[i] = c.cells[r]
		}
		line(cells, rows[r].Message)
	}
	return b.String()
}

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
