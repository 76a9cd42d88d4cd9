package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

func newEventsCommand() *cobra.Command {
	var cluster clusterFlags
	var scope scopeFlags
	cmd := &cobra.Command{
		Use:   "events CLUSTER",
		Short: "List the events of a ClusterDeployment (stage transitions, failed attempts), oldest first",
		Long: `Events lists the Kubernetes events (events.k8s.io/v1) whose subject is the
ClusterDeployment: every stage that started, became Ready or failed an
attempt, and every failed reconcile, oldest first. Repeated events show
how often they occurred. Kubernetes keeps events for an hour by default.`,
		Example: `  capstan events mgmt-east -n capstan-system`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
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
			v := terminalView(cmd.OutOrStdout())
			v.now = time.Now()
			_, err = io.WriteString(cmd.OutOrStdout(), v.renderEvents(events, ns+"/"+args[0]))
			return err
		},
	}
	cluster.BindFlags(cmd.Flags())
	scope.BindFlags(cmd.Flags(), false)
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

// renderEvents draws a table: when, type, reason and message (with how
// often it repeated), every line within v.width.
func (v view) renderEvents(events []eventsv1.Event, subject string) string {
	if len(events) == 0 {
		return fit("No events for ClusterDeployment "+subject+" (Kubernetes keeps events for an hour by default).", v.width) + "\n"
	}
	type row struct{ time, age, typ, reason, message string }
	head := row{"TIME (UTC)", "AGE", "TYPE", "REASON", "MESSAGE"}
	rows := make([]row, len(events))
	ageW, typeW, reasonW := len(head.age), len(head.typ), len(head.reason)
	for i, e := range events {
		msg := oneLine(e.Note)
		if n := occurrences(e); n > 1 {
			msg = fmt.Sprintf("(x%d, last %s ago) %s", n, duration.HumanDuration(v.now.Sub(lastSeen(e))), msg)
		}
		rows[i] = row{
			time:    firstSeen(e).UTC().Format("2006-01-02 15:04:05"),
			age:     duration.HumanDuration(v.now.Sub(firstSeen(e))),
			typ:     e.Type,
			reason:  e.Reason,
			message: msg,
		}
		ageW = max(ageW, len(rows[i].age))
		typeW = max(typeW, len(rows[i].typ))
		reasonW = max(reasonW, min(utf8.RuneCountInString(rows[i].reason), 24))
	}
	timeW := len("2006-01-02 15:04:05")
	msgW := v.width - timeW - ageW - typeW - reasonW - 4*len(colGap)
	var b strings.Builder
	for i, r := range append([]row{head}, rows...) {
		typ := pad(r.typ, typeW)
		if i > 0 && r.typ == "Warning" {
			typ = v.paint(sgrRed, typ)
		}
		line := pad(r.time, timeW) + colGap + pad(r.age, ageW) + colGap + typ + colGap +
			pad(fit(r.reason, reasonW), reasonW) + colGap + fit(r.message, msgW)
		line = strings.TrimRight(line, " ")
		if i == 0 {
			line = v.paint(sgrBold, line)
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}
