package report

import (
	"fmt"
	"slices"
	"strings"

	"github.com/capstan-dev/capstan/stages"
)

// PlanMarkerKey is the key of the pull-request comment that holds the
// plan: the forge finds the comment again by the hidden marker line
// forge.Marker(PlanMarkerKey), which is PlanMarker.
const PlanMarkerKey = "plan"

// PlanMarker is the hidden first line of a plan comment.
const PlanMarker = "<!-- capstan:" + PlanMarkerKey + " -->"

// planHeading begins every plan, rolloutHeading every rollout: reading a
// comment back, they tell which it holds.
const (
	planHeading    = "### Capstan plan"
	rolloutHeading = "### Capstan rollout of #"
)

// PlanCommentInput is what a plan comment shows: the revision of a pull
// request's head and, per ClusterDeployment it changes, the diff against
// the live cluster or why there is none.
type PlanCommentInput struct {
	// Revision is the revision planned, e.g. pr-12@sha1:4f2c....
	Revision string
	// PRNumber is the pull request's number; 0 leaves it out.
	PRNumber int64
	// Deployments are the ClusterDeployments the revision changes.
	Deployments []PlanCommentDeployment
	// NotPlanned are the ClusterDeployments that did not plan the
	// revision, each with why.
	NotPlanned []PlanCommentNotPlanned
	// Secrets are the data of further Secrets whose values must not reach
	// the comment (the source's credentials, a kubeconfig), beside those
	// the diffs saw.
	Secrets []map[string][]byte
}

// PlanCommentDeployment is one deployment's part of a plan comment.
type PlanCommentDeployment struct {
	Name, Namespace string
	// Diff is what the revision would do; nil when Err says why there is
	// no diff.
	Diff *stages.PlanDiff
	// Err is a render, plan or validation error (render.Error carries the
	// file and field) or the reason the cluster could not be asked.
	Err error
	// Live says what the clusters held when the diff was made, after
	// "Compared with the clusters" (e.g. "as `main@sha1:…` left them
	// (Ready)"); empty leaves the line out.
	Live string
	// ValuesHidden says that Diff holds no values
	// (stages.PlanDiff.WithoutValues), so that the comment says why.
	ValuesHidden bool
}

// PlanCommentNotPlanned is a deployment that did not plan the revision.
type PlanCommentNotPlanned struct {
	Name, Namespace string
	// Why is one sentence of markdown.
	Why string
}

// Size bounds: a comment stays well under the forges' 65,536 characters,
// and one deployment with thousands of objects does not crowd out the
// others.
const (
	// maxDetailLines bounds the lines of one deployment's object list.
	maxDetailLines = 400
	// maxMachinesShown bounds the machines named per rollout batch.
	maxMachinesShown = 8
	// maxCommentLen is where the object lists are dropped altogether.
	maxCommentLen = 60000
)

// RenderPlanComment renders the plan of a revision as the markdown body
// of a pull-request comment, readable on GitHub, Gitea and GitLab: the
// marker line, the revision, per deployment a summary (N create / M change
// / K delete), the stages that would run again, the rollout batches, the
// problems with file and field, and the per-object field diff in a
// collapsed <details> block. Anything that could be a value of a Secret
// the diffs saw, or of input.Secrets, is scrubbed from the final text.
// The output depends only on the input.
func RenderPlanComment(in PlanCommentInput) string {
	deployments := slices.Clone(in.Deployments)
	slices.SortFunc(deployments, func(a, b PlanCommentDeployment) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	s := &scrubber{}
	for _, data := range in.Secrets {
		s.add(data)
	}
	for _, d := range deployments {
		if d.Diff != nil {
			for _, data := range d.Diff.SecretData() {
				s.add(data)
			}
		}
	}
	s.done()

	text := renderPlan(in, deployments, true)
	if len(text) > maxCommentLen {
		text = renderPlan(in, deployments, false)
	}
	for strings.Contains(text, "\n\n\n") {
		text = strings.ReplaceAll(text, "\n\n\n", "\n\n")
	}
	return s.clean(strings.TrimRight(text, "\n") + "\n")
}

func renderPlan(in PlanCommentInput, deployments []PlanCommentDeployment, details bool) string {
	var b strings.Builder
	b.WriteString(PlanMarker + "\n")
	b.WriteString(planHeading)
	if in.PRNumber > 0 {
		fmt.Fprintf(&b, " for #%d", in.PRNumber)
	}
	b.WriteString("\n\n")
	fmt.Fprintf(&b, "Revision %s, compared with the live clusters by a server-side dry run. Nothing has been applied.\n", code(in.Revision))
	switch {
	case len(deployments) == 0 && len(in.NotPlanned) == 0:
		b.WriteString("\nThis revision changes no ClusterDeployment.\n")
	case len(deployments) == 0:
		b.WriteString("\nThis revision changes no ClusterDeployment that planned it.\n")
	}
	for _, d := range deployments {
		b.WriteString("\n")
		writeDeployment(&b, d, details)
	}
	for _, n := range in.NotPlanned {
		fmt.Fprintf(&b, "\n#### :no_entry_sign: %s: not planned\n\n%s\n", code(n.Namespace+"/"+n.Name), n.Why)
	}
	if !details {
		b.WriteString("\n_The per-object diffs are left out: they do not fit in one comment. `capstan diff` prints them._\n")
	}
	return b.String()
}

func writeDeployment(b *strings.Builder, d PlanCommentDeployment, details bool) {
	name := d.Namespace + "/" + d.Name
	if d.Diff == nil {
		fmt.Fprintf(b, "#### :x: %s: no plan\n\n", code(name))
		writeErrors(b, d.Err)
		return
	}
	c := d.Diff.Counts()
	icon := ":white_check_mark:"
	switch {
	case c.Problems > 0 || d.Err != nil:
		icon = ":x:"
	case d.Diff.Changes():
		icon = ":large_blue_circle:"
	}
	fmt.Fprintf(b, "#### %s %s: %s\n\n", icon, code(name), summary(c))
	if d.Live != "" {
		fmt.Fprintf(b, "Compared with the clusters %s.\n\n", d.Live)
	}
	if d.ValuesHidden {
		b.WriteString("Changed fields are listed without their values: `spec.report.pullRequests.values` is `hide`, " +
			"or the pull request comes from a fork and it is not `show`.\n\n")
	}
	if d.Err != nil {
		writeErrors(b, d.Err)
	}
	writeStages(b, d.Diff)
	writeSecrets(b, d.Diff)
	writeProblems(b, d.Diff.Problems())
	writeRollouts(b, d.Diff.Rollouts())
	if details {
		writeDetails(b, d.Diff)
	}
}

func summary(c stages.DiffCounts) string {
	parts := []string{
		fmt.Sprintf("%d create", c.Create),
		fmt.Sprintf("%d change", c.Change),
		fmt.Sprintf("%d delete", c.Delete),
	}
	if c.Held+c.Kept > 0 {
		parts = append(parts, fmt.Sprintf("%d kept", c.Held+c.Kept))
	}
	if c.Problems > 0 {
		parts = append(parts, fmt.Sprintf("**%d problems**", c.Problems))
	}
	if c.NotCompared > 0 {
		parts = append(parts, fmt.Sprintf("%d not compared", c.NotCompared))
	}
	return strings.Join(parts, " / ") + fmt.Sprintf(" (%d unchanged)", c.Unchanged)
}

// writeErrors lists the problems of an error that kept the plan from
// being made, one per line (render and plan errors join several, each
// naming file, object and field), in a code block that no markdown in
// them can break out of.
func writeErrors(b *strings.Builder, err error) {
	if err == nil {
		return
	}
	b.WriteString("The revision cannot be applied:\n\n")
	var lines []string
	for _, e := range flatten(err) {
		lines = append(lines, strings.Split(e.Error(), "\n")...)
	}
	writeBlock(b, "text", lines)
}

// flatten returns the errors err joins, depth first, or err alone.
func flatten(err error) []error {
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var out []error
	for _, e := range joined.Unwrap() {
		out = append(out, flatten(e)...)
	}
	return out
}

func writeStages(b *strings.Builder, d *stages.PlanDiff) {
	var working, rechecked []string
	for _, s := range d.Stages {
		switch {
		case s.Works:
			working = append(working, fmt.Sprintf("%s (%s)", code(s.Name), s.Why))
		case s.Runs:
			rechecked = append(rechecked, code(s.Name))
		}
	}
	switch {
	case len(working) > 0:
		b.WriteString("**Stages that run again:** " + strings.Join(working, ", ") + ".")
		if len(rechecked) > 0 {
			b.WriteString(" The others (" + strings.Join(rechecked, ", ") + ") are re-checked at the new revision and pass once their checks hold.")
		}
		b.WriteString("\n\n")
	case len(rechecked) > 0:
		b.WriteString("**No stage changes anything;** every stage is re-checked at the new revision.\n\n")
	}
	held := 0
	for _, o := range d.Prune {
		if o.Action == stages.DiffHeld {
			held++
		}
	}
	if held > 0 {
		fmt.Fprintf(b, "**%d objects the revision drops are kept:** their kinds are destructive; set `spec.prune.destructive` to delete them.\n\n", held)
	}
}

func writeProblems(b *strings.Builder, problems []stages.ObjectDiff) {
	if len(problems) == 0 {
		return
	}
	b.WriteString("**Problems** (the stage of each stops there; nothing of that stage is applied):\n\n")
	var lines []string
	for _, g := range groupProblems(problems) {
		o := g[0]
		if len(g) == 1 {
			where := o.Ref
			if o.File != "" {
				where = o.File + ": " + where
			}
			if o.Field != "" {
				where += ": " + o.Field
			}
			lines = append(lines, fmt.Sprintf("%s: %s: %s", where, o.Action, o.Error))
			continue
		}
		// One line per cause: a namespace nobody creates is one line,
		// not one per object in it (preflight.Group does the same).
		var names, files []string
		for i, p := range g {
			if i < 3 {
				names = append(names, p.Ref)
			}
			if p.File != "" && !slices.Contains(files, p.File) {
				files = append(files, p.File)
			}
		}
		where := fmt.Sprintf("%d objects (%s", len(g), strings.Join(names, ", "))
		if more := len(g) - len(names); more > 0 {
			where += fmt.Sprintf(" and %d more", more)
		}
		where += ")"
		if len(files) > 0 {
			where += " in " + strings.Join(files, ", ")
		}
		if o.Field != "" {
			where += ": " + o.Field
		}
		lines = append(lines, fmt.Sprintf("%s: %s: %s", where, o.Action, o.Error))
	}
	writeBlock(b, "text", lines)
}

// groupProblems groups problems of one cause (the same action, field and
// error), in the order each cause first appears.
func groupProblems(problems []stages.ObjectDiff) [][]stages.ObjectDiff {
	type key struct{ action, field, err string }
	index := map[key]int{}
	var groups [][]stages.ObjectDiff
	for _, o := range problems {
		k := key{string(o.Action), o.Field, o.Error}
		i, ok := index[k]
		if !ok {
			i = len(groups)
			index[k] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], o)
	}
	return groups
}

func writeRollouts(b *strings.Builder, rollouts []stages.RolloutDiff) {
	if len(rollouts) == 0 {
		return
	}
	b.WriteString("**Rollouts:**\n\n")
	for _, r := range rollouts {
		fmt.Fprintf(b, "- %s: %s\n", code(r.Object), escape(strings.Join(r.Changes, ", ")))
		if r.Strategy != "" {
			fmt.Fprintf(b, "  %s\n", escape(r.Strategy))
		}
		for i, batch := range r.Batches {
			fmt.Fprintf(b, "  %d. %s\n", i+1, batchLine(batch))
		}
	}
	b.WriteString("\n")
}

// batchLine says what one rollout batch does, naming a few machines.
func batchLine(batch stages.RolloutBatch) string {
	who := "machines"
	if batch.Type != "" {
		who = batch.Type + "s"
		if len(batch.Machines) == 1 {
			who = batch.Type
		}
	}
	names := batch.Machines
	more := ""
	if len(names) > maxMachinesShown {
		more = fmt.Sprintf(" and %d more", len(names)-maxMachinesShown)
		names = names[:maxMachinesShown]
	}
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = code(n)
	}
	s := fmt.Sprintf("%s: %s %s %s%s", code(batch.Stage), batch.Phase, who, strings.Join(quoted, ", "), more)
	if batch.Drain {
		s += " (cordoned and drained first)"
	}
	return s
}

// writeDetails lists every object with its marker and field diff, in a
// diff block (coloured on GitHub and Gitea), collapsed.
func writeDetails(b *strings.Builder, d *stages.PlanDiff) {
	var lines []string
	count := 0
	for _, s := range d.Stages {
		if len(s.Objects) == 0 {
			continue
		}
		header := "# stage " + s.Name
		if s.Cluster != "" {
			header += " (on the cluster of " + s.Cluster + ")"
		}
		lines = append(lines, header)
		for _, o := range s.Objects {
			lines = append(lines, objectLines(o)...)
			count++
		}
	}
	if len(d.Prune) > 0 {
		lines = append(lines, "# prune, once every stage is Ready")
		for _, o := range d.Prune {
			lines = append(lines, objectLines(o)...)
			count++
		}
	}
	if count == 0 {
		return
	}
	if len(lines) > maxDetailLines {
		cut := len(lines) - maxDetailLines
		lines = append(lines[:maxDetailLines], fmt.Sprintf("# ... %d more lines; capstan diff prints them all", cut))
	}
	fmt.Fprintf(b, "<details><summary>Objects (%d)</summary>\n\n", count)
	writeBlock(b, "diff", lines)
	b.WriteString("</details>\n\n")
}

func objectLines(o stages.ObjectDiff) []string {
	marker := map[stages.DiffAction]string{
		stages.DiffCreate: "+", stages.DiffChange: "~", stages.DiffDelete: "-",
		stages.DiffUnchanged: "=", stages.DiffHeld: "=", stages.DiffKept: "=",
		stages.DiffNotCompared: "?",
	}[o.Action]
	if marker == "" {
		marker = "!"
	}
	line := marker + " " + o.Ref
	switch {
	case o.Problem():
		line += " (" + string(o.Action) + ")"
	case o.Action == stages.DiffHeld || o.Action == stages.DiffKept:
		line += " (" + string(o.Action) + ": " + o.Note + ")"
	case o.Action == stages.DiffNotCompared && o.Note == "":
		line += " (not compared)"
	case o.Note != "":
		line += " (" + o.Note + ")"
	}
	if o.Stage != "" {
		line += " (stage " + o.Stage + ")"
	}
	lines := []string{line}
	for _, f := range o.Fields {
		lines = append(lines, "    "+f.String())
	}
	return lines
}

// writeBlock writes lines as a fenced code block of lang. A line that
// would close the fence is defused.
func writeBlock(b *strings.Builder, lang string, lines []string) {
	b.WriteString("```" + lang + "\n")
	for _, l := range lines {
		b.WriteString(strings.ReplaceAll(l, "```", "'''") + "\n")
	}
	b.WriteString("```\n\n")
}

// code puts s in an inline code span, choosing a fence it does not hold.
func code(s string) string {
	if s == "" {
		return "`(none)`"
	}
	fence := "`"
	for strings.Contains(s, fence) {
		fence += "`"
	}
	if strings.HasPrefix(s, "`") || strings.HasSuffix(s, "`") {
		return fence + " " + s + " " + fence
	}
	return fence + s + fence
}

// escape keeps text from the diff from being read as markdown or HTML.
func escape(s string) string {
	r := strings.NewReplacer(`\`, `\\`, "`", "\\`", "*", `\*`, "_", `\_`, "<", "&lt;", "[", `\[`, "]", `\]`, "|", `\|`)
	return r.Replace(s)
}
