package main

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/duration"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// The stage name column is capped so that the message keeps room, and
// shrinks further on a narrow terminal.
const (
	maxStageName = 32
	minStageName = 12
)

// renderStages draws the table of a deployment's stages: name, state,
// progress (when a stage counts any), age, attempts and message; with -o
// wide also the objects of each stage, whole names and whole messages.
func (v view) renderStages(b *strings.Builder, stages []capstanv1.StageStatus) {
	// The message keeps a quarter of the width: the name gives way. With
	// -o wide a message that lacks room goes under its row instead.
	t := &textTable{room: max(minMessage, v.width/4), last: lastCut, shrink: []int{0}}
	if v.wide {
		t.last = lastWrap
	}
	name := t.add(&column{header: "NAME", max: maxStageName, min: minStageName})
	if v.wide {
		name.max = 0
	}
	state := t.add(&column{header: "STATE"})
	var progress *column
	if v.wide || anyProgress(stages) {
		progress = t.add(&column{header: "PROGRESS"})
	}
	age := t.add(&column{header: "AGE"})
	attempts := t.add(&column{header: "ATTEMPTS"})
	var objects *column
	if v.wide {
		objects = t.add(&column{header: "OBJECTS"})
	}
	message := t.add(&column{header: "MESSAGE"})
	for _, st := range stages {
		name.cells = append(name.cells, st.Name)
		state.cells = append(state.cells, stateText(st))
		state.colors = append(state.colors, stateColor(st))
		if progress != nil {
			progress.cells = append(progress.cells, v.progressText(st))
		}
		a := "-"
		if st.StartedAt != nil && st.State != capstanv1.StagePending {
			a = duration.HumanDuration(v.now.Sub(st.StartedAt.Time))
		}
		age.cells = append(age.cells, a)
		attempts.cells = append(attempts.cells, fmt.Sprint(st.Attempts))
		if objects != nil {
			objects.cells = append(objects.cells, fmt.Sprint(st.Objects))
		}
		msg := oneLine(st.Message)
		if st.State == capstanv1.StageReady && st.StartedAt != nil && st.FinishedAt != nil {
			msg = "ready after " + duration.HumanDuration(st.FinishedAt.Sub(st.StartedAt.Time))
		}
		message.cells = append(message.cells, msg)
	}
	b.WriteString(t.render(v))
}

func anyProgress(stages []capstanv1.StageStatus) bool {
	for _, st := range stages {
		if st.Progress != nil && st.State != capstanv1.StagePending {
			return true
		}
	}
	return false
}

// progressText is a stage's PROGRESS cell: "3/5", with -o wide "3/5
// machines ready"; "-" when the stage counts nothing.
func (v view) progressText(st capstanv1.StageStatus) string {
	p := st.Progress
	switch {
	case p == nil || st.State == capstanv1.StagePending:
		return "-"
	case v.wide:
		return p.String()
	}
	return fmt.Sprintf("%d/%d", p.Done, p.Total)
}
