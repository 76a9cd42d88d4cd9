package main

import (
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/spf13/cobra"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

func newEventsCommand() *cobra.Command {
	var cluster clusterFlags
	var scope scopeFlags
	var out outputFlags
	cmd := &cobra.Command{
		Use:   "events CLUSTER",
		Short: "List the events of a ClusterDeployment (stage transitions, failed attempts), oldest first",
		Long: `Events lists the Kubernetes events (events.k8s.io/v1) whose subject is the
ClusterDeployment: every stage that started, became Ready or failed an
attempt, and every failed reconcile, oldest first. Repeated events show
how often they occurred. Kubernetes keeps events for an hour by default.

The table fits the terminal's width (80 columns when stdout is not a
terminal, unless $COLUMNS or --width say otherwise); messages are cut to
it, or wrapped whole with -o wide, which also names the Capstan instance
that reported each event. -o yaml|json prints the same fields for scripts.`,
		Example: `  capstan events mgmt-east -n capstan-system
  capstan events mgmt-east -o wide --width 120`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			ns, err := scope.resolve(&cluster)
			if err != nil {
				return err
			}
			c, err := cluster.client()
			if err != nil {
				return err
			}
			list := &eventsv1.EventList{}
			if err := c.List(cmd.Context(), list, client.InNamespace(ns)); err != nil {
				return fmt.Errorf("list events in namespace %s: %w", ns, err)
			}
			events := eventsOf(list.Items, ns, args[0])
			w := cmd.OutOrStdout()
			if out.structured() {
				data, err := encode(eventRows(events), out.output)
				if err != nil {
					return err
				}
				_, err = w.Write(data)
				return err
			}
			v := out.view(w)
			v.now = time.Now()
			_, err = io.WriteString(w, v.renderEvents(events, ns+"/"+args[0]))
			return err
		},
	}
	cluster.BindFlags(cmd.Flags())
	scope.BindFlags(cmd.Flags(), false)
	out.BindFlags(cmd.Flags(), "the reporting instance, whole messages wrapped")
	return cmd
}

// eventsOf keeps the events about one ClusterDeployment, oldest first.
func eventsOf(all []eventsv1.Event, namespace, name string) []eventsv1.Event {
	var out []eventsv1.Event
	for _, e := range all {
		r := e.Regarding
		if r.Kind == capstanv1.ClusterDeploymentKind && r.Name == name && (r.Namespace == "" || r.Namespace == namespace) {
			out = append(out, e)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return firstSeen(out[i]).Before(firstSeen(out[j])) })
	return out
}

// firstSeen is when an event first occurred; older producers set only the
// deprecated timestamps.
func firstSeen(e eventsv1.Event) time.Time {
	switch {
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	case !e.DeprecatedFirstTimestamp.IsZero():
		return e.DeprecatedFirstTimestamp.Time
	default:
		return e.CreationTimestamp.Time
	}
}

// lastSeen is when a repeated event last occurred.
func lastSeen(e eventsv1.Event) time.Time {
	switch {
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.Time
	case !e.DeprecatedLastTimestamp.IsZero():
		return e.DeprecatedLastTimestamp.Time
	default:
		return firstSeen(e)
	}
}

func occurrences(e eventsv1.Event) int32 {
	switch {
	case e.Series != nil && e.Series.Count > 0:
		return e.Series.Count
	case e.DeprecatedCount > 0:
		return e.DeprecatedCount
	default:
		return 1
	}
}

// eventRow is one event as -o yaml|json prints it.
type eventRow struct {
	FirstSeen time.Time `json:"firstSeen"`
	LastSeen  time.Time `json:"lastSeen"`
	Count     int32     `json:"count"`
	Type      string    `json:"type"`
	Reason    string    `json:"reason"`
	Message   string    `json:"message"`
	// Reporter is the controller and instance that reported the event.
	Reporter string `json:"reporter,omitempty"`
	// Controller is the controller that reported it.
	Controller string `json:"controller,omitempty"`
}

func eventRows(events []eventsv1.Event) []eventRow {
	rows := make([]eventRow, len(events))
	for i, e := range events {
		rows[i] = eventRow{
			FirstSeen: firstSeen(e).UTC(), LastSeen: lastSeen(e).UTC(), Count: occurrences(e),
			Type: e.Type, Reason: e.Reason, Message: e.Note, Reporter: reporter(e), Controller: e.ReportingController,
		}
	}
	return rows
}

// reporter names who reported an event: the Capstan instance (its pod),
// else the controller.
func reporter(e eventsv1.Event) string {
	switch {
	case e.ReportingInstance != "":
		return e.ReportingInstance
	case e.ReportingController != "":
		return e.ReportingController
	}
	return e.DeprecatedSource.Component
}

// maxReason caps the REASON column of events.
const maxReason = 24

// renderEvents draws a table: when, type, reason and message (with how
// often it repeated), every line within v.width; -o wide adds who
// reported it and wraps whole messages.
func (v view) renderEvents(events []eventsv1.Event, subject string) string {
	if len(events) == 0 {
		return fit("No events for ClusterDeployment "+subject+" (Kubernetes keeps events for an hour by default).", v.width) + "\n"
	}
	t := &textTable{room: minMessage}
	if v.wide {
		t.last = lastWrap
	}
	at := t.add(&column{header: "TIME (UTC)"})
	age := t.add(&column{header: "AGE"})
	typ := t.add(&column{header: "TYPE"})
	reason := t.add(&column{header: "REASON", max: maxReason, min: len("REASON")})
	t.shrink = []int{3}
	var from *column
	if v.wide {
		from = t.add(&column{header: "REPORTER", min: len("REPORTER")})
		t.shrink = []int{4, 3}
	}
	message := t.add(&column{header: "MESSAGE"})
	for _, e := range events {
		msg := oneLine(e.Note)
		if n := occurrences(e); n > 1 {
			msg = fmt.Sprintf("(x%d, last %s ago) %s", n, duration.HumanDuration(v.now.Sub(lastSeen(e))), msg)
		}
		at.cells = append(at.cells, firstSeen(e).UTC().Format("2006-01-02 15:04:05"))
		age.cells = append(age.cells, duration.HumanDuration(v.now.Sub(firstSeen(e))))
		typ.cells = append(typ.cells, e.Type)
		color := ""
		if e.Type == "Warning" {
			color = sgrRed
		}
		typ.colors = append(typ.colors, color)
		reason.cells = append(reason.cells, e.Reason)
		if from != nil {
			from.cells = append(from.cells, orDash(reporter(e)))
		}
		message.cells = append(message.cells, msg)
	}
	return t.render(v)
}
