package preflight

import (
	"fmt"
	"path"
	"strings"
)

// Group is the problems of one cause: the same severity, field and
// message, on different objects (a missing Namespace that twenty objects
// live in, a field misspelt in every host). One line says it once.
type Group struct {
	// Problems are the group's problems, in report order.
	Problems []Problem
	// Files are the files the problems' objects came from, in order, each
	// once.
	Files []string
	// message is the problems' message without its file.
	message string
}

// groupNamed is how many objects a group's line names when no width
// bounds it.
const groupNamed = 3

// Groups returns the report's problems grouped by cause, in the order
// each cause first appears. Two problems share a cause when they have the
// same severity, field and message once the " (in FILE)" that the
// preflight checks end a message with is set aside; the file is kept
// apart, so that objects of several files share a line.
func (r Report) Groups() []Group {
	type key struct {
		warning        bool
		field, message string
	}
	index := map[key]int{}
	var groups []Group
	for _, p := range r.Problems {
		msg, file := splitFile(p.Message)
		k := key{p.Warning, p.Field, msg}
		i, ok := index[k]
		if !ok {
			i = len(groups)
			index[k] = i
			groups = append(groups, Group{message: msg})
		}
		g := &groups[i]
		g.Problems = append(g.Problems, p)
		if file != "" && !contains(g.Files, file) {
			g.Files = append(g.Files, file)
		}
	}
	return groups
}

// splitFile cuts the " (in FILE)" a message ends with.
func splitFile(msg string) (string, string) {
	i := strings.LastIndex(msg, " (in ")
	if i < 0 || !strings.HasSuffix(msg, ")") {
		return msg, ""
	}
	file := msg[i+len(" (in ") : len(msg)-1]
	if file == "" || strings.ContainsAny(file, " ()") {
		return msg, ""
	}
	return msg[:i], file
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Line returns the group as one line of a report. A group of one problem
// is that problem's Line. A larger one counts the objects and names the
// first few and the files: `ERROR 21 objects (BareMetalHost orion/node-0
// and 20 more): metadata.namespace: namespace orion does not exist ...
// (in clusters/orion/hosts.yaml, network.yaml)`. The messages are as long
// as they need to be, so width bounds the lists alone: each takes at most
// a third of it (at least its first name); width 0 names groupNamed
// objects and every file.
func (g Group) Line(width int) string {
	if len(g.Problems) == 1 {
		return g.Problems[0].Line()
	}
	if width <= 0 {
		return g.line(min(groupNamed, len(g.Problems)), len(g.Files))
	}
	named, files := 1, 1
	for n := min(groupNamed, len(g.Problems)); n > 1; n-- {
		if len(g.objectList(n)) <= width/3 {
			named = n
			break
		}
	}
	for n := len(g.Files); n > 1; n-- {
		if len(fileList(g.Files, n)) <= width/3 {
			files = n
			break
		}
	}
	return g.line(named, files)
}

// line is the group's line naming its first named objects and files.
func (g Group) line(named, files int) string {
	severity := "ERROR "
	if g.Problems[0].Warning {
		severity = "WARNING "
	}
	text := fmt.Sprintf("%s%d objects (%s): %s: %s", severity, len(g.Problems), g.objectList(named), g.Problems[0].Field, g.message)
	if len(g.Files) > 0 {
		text += " (in " + fileList(g.Files, max(files, 1)) + ")"
	}
	return text
}

// objectList names the first named objects and counts the others.
func (g Group) objectList(named int) string {
	objects := make([]string, 0, named)
	for _, p := range g.Problems[:named] {
		objects = append(objects, p.Object)
	}
	list := strings.Join(objects, ", ")
	if more := len(g.Problems) - named; more > 0 {
		list += fmt.Sprintf(" and %d more", more)
	}
	return list
}

// fileList names the first n files: the first in full, each later one
// in the same folder by its base name.
func fileList(files []string, n int) string {
	n = min(n, len(files))
	dir := path.Dir(files[0])
	names := []string{files[0]}
	for _, f := range files[1:n] {
		if path.Dir(f) == dir {
			f = path.Base(f)
		}
		names = append(names, f)
	}
	list := strings.Join(names, ", ")
	if more := len(files) - n; more == 1 {
		list += " and 1 more file"
	} else if more > 1 {
		list += fmt.Sprintf(" and %d more files", more)
	}
	return list
}

// GroupedLines returns the report as text, one Group.Line per cause,
// errors and warnings in report order.
func (r Report) GroupedLines(width int) string {
	var b strings.Builder
	for _, g := range r.Groups() {
		b.WriteString(g.Line(width))
		b.WriteByte('\n')
	}
	return b.String()
}
