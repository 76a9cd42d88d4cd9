package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"sigs.k8s.io/yaml"

	"github.com/capstan-dev/capstan/stages"
)

// diffReport is what `capstan diff -o json|yaml` prints.
type diffReport struct {
	Deployment string `json:"deployment"`
	Server     string `json:"server"`
	// ServiceAccount is the one the deployment's objects were compared
	// as (namespace/name); empty: as the kubeconfig's user.
	ServiceAccount string `json:"serviceAccount,omitempty"`
	LiveRevision   string `json:"liveRevision,omitempty"`
	// BootstrapKey says where the plan's bootstrap key came from; nil
	// when the plan needs none.
	BootstrapKey *bootstrapKeyReport `json:"bootstrapKey,omitempty"`
	Diff         *stages.PlanDiff    `json:"diff"`
}

func printDiff(w io.Writer, r diffReport, format string, width int) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	case "yaml":
		data, err := yaml.Marshal(r)
		if err != nil {
			return err
		}
		_, err = w.Write(data)
		return err
	}
	var b strings.Builder
	writeDiffText(&b, r)
	for _, line := range strings.SplitAfter(b.String(), "\n") {
		if _, err := io.WriteString(w, wrapLine(line, width)); err != nil {
			return err
		}
	}
	return nil
}

// diffMarker is the mark of an object's line.
func diffMarker(a stages.DiffAction) string {
	switch a {
	case stages.DiffCreate:
		return "+"
	case stages.DiffChange:
		return "~"
	case stages.DiffDelete:
		return "-"
	case stages.DiffUnchanged, stages.DiffHeld, stages.DiffKept:
		return "="
	case stages.DiffNotCompared:
		return "?"
	}
	return "!"
}

func writeDiffText(b *strings.Builder, r diffReport) {
	d := r.Diff
	c := d.Counts()
	fmt.Fprintf(b, "ClusterDeployment %s against %s", r.Deployment, r.Server)
	if r.ServiceAccount != "" {
		fmt.Fprintf(b, " as ServiceAccount %s", r.ServiceAccount)
	}
	if r.LiveRevision != "" {
		fmt.Fprintf(b, " (live revision %s)", r.LiveRevision)
	}
	b.WriteString("\n")
	if r.BootstrapKey != nil && r.BootstrapKey.Note != "" {
		fmt.Fprintf(b, "%s\n", r.BootstrapKey.Note)
	}
	fmt.Fprintf(b, "%s\n", summaryLine(c))
	if !d.Changes() {
		b.WriteString("no changes: every object is as the cluster has it\n")
	}
	for _, s := range d.Stages {
		fmt.Fprintf(b, "\nstage %s (%s)", s.Name, s.Action)
		if s.Cluster != "" {
			fmt.Fprintf(b, " on the cluster of %s", s.Cluster)
		}
		switch {
		case s.Works || (s.Why != "" && d.Changes()):
			fmt.Fprintf(b, ": %s", s.Why)
		case len(s.Objects) > 0:
			b.WriteString(": no changes")
		}
		b.WriteString("\n")
		for _, o := range s.Objects {
			writeObjectText(b, o)
		}
		for _, ro := range s.Rollouts {
			writeRolloutText(b, ro)
		}
	}
	if len(d.Prune) > 0 {
		b.WriteString("\nprune (once every stage is Ready, in reverse stage order)\n")
		for _, o := range d.Prune {
			writeObjectText(b, o)
		}
	}
}

func summaryLine(c stages.DiffCounts) string {
	s := fmt.Sprintf("%d to create, %d to change, %d to delete, %d unchanged", c.Create, c.Change, c.Delete, c.Unchanged)
	if c.Held+c.Kept > 0 {
		s += fmt.Sprintf(", %d kept by prune rules", c.Held+c.Kept)
	}
	if c.Problems > 0 {
		s += ", " + plural(c.Problems, "problem")
	}
	if c.NotCompared > 0 {
		s += fmt.Sprintf(", %d not compared", c.NotCompared)
	}
	return s
}

func writeObjectText(b *strings.Builder, o stages.ObjectDiff) {
	fmt.Fprintf(b, "  %s %s", diffMarker(o.Action), strings.Replace(o.Ref, "/", " ", 1))
	if o.Stage != "" {
		fmt.Fprintf(b, " (stage %s)", o.Stage)
	}
	switch {
	case o.Problem():
		fmt.Fprintf(b, ": %s", o.Action)
		if o.File != "" {
			fmt.Fprintf(b, " (in %s)", o.File)
		}
		if o.Field != "" {
			fmt.Fprintf(b, " at %s", o.Field)
		}
		fmt.Fprintf(b, ": %s", o.Error)
	case o.Action == stages.DiffHeld || o.Action == stages.DiffKept:
		fmt.Fprintf(b, ": %s: %s", o.Action, o.Note)
	case o.Note != "":
		fmt.Fprintf(b, " (%s)", o.Note)
	}
	b.WriteString("\n")
	for _, fd := range o.Fields {
		fmt.Fprintf(b, "      %s\n", fd)
	}
}

func writeRolloutText(b *strings.Builder, r stages.RolloutDiff) {
	fmt.Fprintf(b, "  rollout of %s: %s\n", strings.Replace(r.Object, "/", " ", 1), strings.Join(r.Changes, ", "))
	if r.Strategy != "" {
		fmt.Fprintf(b, "      %s\n", r.Strategy)
	}
	for i, batch := range r.Batches {
		fmt.Fprintf(b, "      %d. %s\n", i+1, batchText(batch))
	}
}

// batchText says what one batch of a rollout does.
func batchText(b stages.RolloutBatch) string {
	who := "machines"
	if b.Type != "" {
		who = b.Type + "s"
	}
	if len(b.Machines) == 1 && b.Type != "" {
		who = b.Type
	}
	s := fmt.Sprintf("%s: %s %s %s", b.Stage, b.Phase, who, strings.Join(b.Machines, ", "))
	if b.Drain {
		s += " (cordoned and drained first)"
	}
	return s
}

// wrapLine breaks a line longer than width at spaces; the continuation
// lines are indented four more than the line. width 0 leaves it, and so
// does a width too narrow for the indent.
func wrapLine(line string, width int) string {
	body := strings.TrimSuffix(line, "\n")
	indent := strings.Repeat(" ", len(body)-len(strings.TrimLeft(body, " "))+4)
	if width <= len(indent)+8 || utf8.RuneCountInString(body) <= width {
		return line
	}
	var out strings.Builder
	for utf8.RuneCountInString(body) > width {
		head := string([]rune(body)[:width])
		cut := strings.LastIndex(head, " ")
		if cut <= len(indent) {
			cut = len(head) // one long word: break it where the width ends
		}
		out.WriteString(strings.TrimRight(body[:cut], " "))
		out.WriteString("\n")
		body = indent + strings.TrimLeft(body[cut:], " ")
	}
	out.WriteString(body)
	if strings.HasSuffix(line, "\n") {
		out.WriteString("\n")
	}
	return out.String()
}
