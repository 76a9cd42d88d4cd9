package sim

import (
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// condition is one metav1.Condition as a simulated controller sets it;
// observedGeneration and lastTransitionTime are filled in by setConditions.
type condition struct {
	typ     string
	status  string // "True", "False" or "Unknown"
	reason  string
	message string
}

func conditionIf(ok bool, typ, reasonTrue, reasonFalse, messageFalse string) condition {
	if ok {
		return condition{typ: typ, status: "True", reason: reasonTrue}
	}
	return condition{typ: typ, status: "False", reason: reasonFalse, message: messageFalse}
}

func isTrue(ok bool) string {
	if ok {
		return "True"
	}
	return "False"
}

// notPaused is the Paused condition every Cluster API object carries.
var notPaused = condition{typ: "Paused", status: "False", reason: "NotPaused"}

// setConditions sets cs on obj's status.conditions the way the Cluster
// API condition helpers do: each stamped with the object's generation, its
// lastTransitionTime kept unless its status changes, other conditions left
// alone.
func setConditions(obj *unstructured.Unstructured, now time.Time, cs ...condition) {
	existing, _, _ := unstructured.NestedFieldNoCopy(obj.Object, "status", "conditions")
	list, _ := existing.([]any)
	for _, c := range cs {
		entry := map[string]any{
			"type":               c.typ,
			"status":             c.status,
			"reason":             c.reason,
			"message":            c.message,
			"observedGeneration": obj.GetGeneration(),
			"lastTransitionTime": now.UTC().Format(time.RFC3339),
		}
		found := false
		for i, e := range list {
			m, ok := e.(map[string]any)
			if !ok || m["type"] != c.typ {
				continue
			}
			if m["status"] == c.status {
				if t, ok := m["lastTransitionTime"].(string); ok {
					entry["lastTransitionTime"] = t
				}
			}
			list[i] = entry
			found = true
			break
		}
		if !found {
			list = append(list, entry)
		}
	}
	set(obj.Object, list, "status", "conditions")
}

// conditionStatus returns the status of condition typ on obj, "" when it
// is not set.
func conditionStatus(obj *unstructured.Unstructured, typ string) string {
	if obj == nil {
		return ""
	}
	list, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, e := range list {
		if m, ok := e.(map[string]any); ok && m["type"] == typ {
			s, _ := m["status"].(string)
			return s
		}
	}
	return ""
}

func conditionTrue(obj *unstructured.Unstructured, typ string) bool {
	return conditionStatus(obj, typ) == "True"
}

// conditionMessage returns the message of condition typ on obj, "" when
// it is not set.
func conditionMessage(obj *unstructured.Unstructured, typ string) string {
	list, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, e := range list {
		if m, ok := e.(map[string]any); ok && m["type"] == typ {
			s, _ := m["message"].(string)
			return s
		}
	}
	return ""
}
