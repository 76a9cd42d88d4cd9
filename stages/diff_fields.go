package stages

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// FieldOp is how a field differs.
type FieldOp string

// How a field differs between the live object and the applied one.
const (
	FieldAdded   FieldOp = "added"
	FieldRemoved FieldOp = "removed"
	FieldChanged FieldOp = "changed"
)

// FieldDiff is one field an apply would change.
type FieldDiff struct {
	// Path is the field, e.g. spec.replicas, metadata.labels.app,
	// spec.template.spec.containers[name=app].image.
	Path string  `json:"path"`
	Op   FieldOp `json:"op"`
	// Old and New are the values, shortened, as one line; empty when the
	// field is added or removed, and always empty for a Secret's data.
	Old string `json:"old,omitempty"`
	New string `json:"new,omitempty"`
	// Redacted is true when the values are left out and only the op is
	// shown: always for a Secret's values, and for every field of a diff
	// whose values are hidden (PlanDiff.HideValues).
	Redacted bool `json:"redacted,omitempty"`
}

// withoutValue is f with its values left out.
func (f FieldDiff) withoutValue() FieldDiff {
	f.Old, f.New, f.Redacted = "", "", true
	return f
}

// String prints the change as `path: old -> new`, `path: (none) -> new`,
// or `data.key: (changed)` for a Secret's value.
func (f FieldDiff) String() string {
	if f.Redacted {
		return f.Path + ": (" + string(f.Op) + ")"
	}
	switch f.Op {
	case FieldAdded:
		return f.Path + ": (none) -> " + f.New
	case FieldRemoved:
		return f.Path + ": " + f.Old + " -> (none)"
	}
	return f.Path + ": " + f.Old + " -> " + f.New
}

// maxValueLen bounds how much of a value a field diff shows.
const maxValueLen = 72

// FieldDiffs lists the fields in which applied differs from live, the
// way a reviewer wants to read them: labels and annotations of the
// metadata, everything outside metadata and status; server-kept metadata
// (managedFields, resourceVersion, generation, uid, creationTimestamp) and
// status are left out. The values of a Secret's data and stringData are
// never shown, only whether a key is added, removed or changed. The list
// is sorted by path.
func FieldDiffs(live, applied *unstructured.Unstructured) []FieldDiff {
	w := fieldWalk{secret: isSecret(applied), decrypted: isDecrypted(applied) || isDecrypted(live)}
	for _, key := range []string{"labels", "annotations"} {
		a, _, _ := unstructured.NestedFieldNoCopy(live.Object, "metadata", key)
		b, _, _ := unstructured.NestedFieldNoCopy(applied.Object, "metadata", key)
		w.walk("metadata."+key, a, b)
	}
	strip := func(u *unstructured.Unstructured) map[string]any {
		c := make(map[string]any, len(u.Object))
		for k, v := range u.Object {
			if k != "metadata" && k != "status" && k != "apiVersion" && k != "kind" {
				c[k] = v
			}
		}
		return c
	}
	w.walk("", strip(live), strip(applied))
	slices.SortStableFunc(w.out, func(a, b FieldDiff) int { return strings.Compare(a.Path, b.Path) })
	return w.out
}

type fieldWalk struct {
	secret bool
	// decrypted: the object came from a sops file, so every field outside
	// the metadata is hidden, whatever its kind.
	decrypted bool
	out       []FieldDiff
}

// walk compares a and b at path: maps key by key, lists of named items by
// name, other lists item by item, anything else as a whole.
func (w *fieldWalk) walk(path string, a, b any) {
	if a == nil && b == nil {
		return
	}
	if w.hidden(path) {
		// A Secret's data: key by key, each only as added, removed or
		// changed.
		am, aok := a.(map[string]any)
		bm, bok := b.(map[string]any)
		if (aok || a == nil) && (bok || b == nil) {
			w.walkMap(path, am, bm)
			return
		}
	}
	if a == nil {
		w.add(path, FieldAdded, nil, b)
		return
	}
	if b == nil {
		w.add(path, FieldRemoved, a, nil)
		return
	}
	if w.hidden(path) {
		if !apiequality.Semantic.DeepEqual(a, b) {
			w.add(path, FieldChanged, a, b)
		}
		return
	}
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		w.walkMap(path, am, bm)
		return
	}
	al, aok := a.([]any)
	bl, bok := b.([]any)
	if aok && bok {
		w.walkList(path, al, bl)
		return
	}
	if !apiequality.Semantic.DeepEqual(a, b) {
		w.add(path, FieldChanged, a, b)
	}
}

// walkMap compares two maps key by key, in key order.
func (w *fieldWalk) walkMap(path string, a, b map[string]any) {
	keys := slices.Sorted(maps.Keys(a))
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		w.walk(join(path, k), a[k], b[k])
	}
}

// walkList compares lists whose items all carry a name by name, others
// item by item.
func (w *fieldWalk) walkList(path string, a, b []any) {
	an, aok := byName(a)
	bn, bok := byName(b)
	if aok && bok {
		names := slices.Sorted(maps.Keys(an))
		for n := range bn {
			if _, ok := an[n]; !ok {
				names = append(names, n)
			}
		}
		slices.Sort(names)
		for _, n := range names {
			w.walk(path+"[name="+n+"]", an[n], bn[n])
		}
		return
	}
	for i := 0; i < max(len(a), len(b)); i++ {
		var x, y any
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		w.walk(fmt.Sprintf("%s[%d]", path, i), x, y)
	}
}

// byName indexes a list of maps by their name field, if every item has
// one and no two share it.
func byName(list []any) (map[string]any, bool) {
	if len(list) == 0 {
		return map[string]any{}, true
	}
	out := make(map[string]any, len(list))
	for _, item := range list {
		m, ok := item.(map[string]any)
		if !ok {
			return nil, false
		}
		name, ok := m["name"].(string)
		if !ok || name == "" {
			return nil, false
		}
		if _, dup := out[name]; dup {
			return nil, false
		}
		out[name] = item
	}
	return out, true
}

// hidden reports whether path holds a Secret value: the data and
// stringData of a Secret, and the annotation in which kubectl keeps a copy
// of the whole object.
func (w *fieldWalk) hidden(path string) bool {
	if w.decrypted && !strings.HasPrefix(path, "metadata.") {
		// Which of its fields sops encrypted is not known here: hide all.
		return true
	}
	if !w.secret {
		return false
	}
	for _, top := range []string{"data", "stringData"} {
		if rest, ok := strings.CutPrefix(path, top); ok && (rest == "" || rest[0] == '.' || rest[0] == '[') {
			return true
		}
	}
	return path == "metadata.annotations.kubectl.kubernetes.io/last-applied-configuration"
}

func (w *fieldWalk) add(path string, op FieldOp, a, b any) {
	f := FieldDiff{Path: path, Op: op}
	if w.hidden(path) {
		f.Redacted = true
	} else {
		if a != nil {
			f.Old = showValue(a)
		}
		if b != nil {
			f.New = showValue(b)
		}
	}
	w.out = append(w.out, f)
}

func join(path, key string) string {
	if !plainKey.MatchString(key) {
		key = strconv.Quote(key)
		if path == "" {
			return "[" + key + "]"
		}
		return path + "[" + key + "]"
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// plainKey is a map key that reads unambiguously after a dot. Label and
// annotation keys with dots and slashes are kept as they are: they are
// always the last element of their path.
var plainKey = regexp.MustCompile(`^[A-Za-z0-9_./-]+$`)

// plainString is a string value shown without quotes.
var plainString = regexp.MustCompile(`^[A-Za-z0-9_./:@+-][A-Za-z0-9_./:@+ -]*$`)

// showValue prints a value on one line, at most maxValueLen runes: plain
// strings bare, anything else as compact JSON.
func showValue(v any) string {
	var s string
	switch v := v.(type) {
	case string:
		s = v
		if !plainString.MatchString(v) || strings.HasSuffix(v, " ") || looksTyped(v) {
			s = strconv.Quote(v)
		}
	default:
		data, err := json.Marshal(v)
		if err != nil {
			s = fmt.Sprint(v)
		} else {
			s = string(data)
		}
	}
	if utf8.RuneCountInString(s) > maxValueLen {
		r := []rune(s)
		s = string(r[:maxValueLen-1]) + "…"
	}
	return s
}

// looksTyped reports a string that would read as a number, a bool or
// null without quotes.
func looksTyped(s string) bool {
	if s == "true" || s == "false" || s == "null" {
		return true
	}
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}

// WithoutValues returns a copy of the diff with every value left out, for
// a reader who may see which fields change but not what they hold (a plan
// comment with spec.report.pullRequests.values: hide, or of a fork): each
// field keeps its path and op, each rollout the fields that start it and
// its batches, but no old or new value, nor the strategy sentence, whose
// machine counts are values. The problems' errors and the notes stay:
// they say why an object cannot be applied. d is not changed.
func (d *PlanDiff) WithoutValues() *PlanDiff {
	out := *d
	out.Stages = slices.Clone(d.Stages)
	for i := range out.Stages {
		s := &out.Stages[i]
		s.Objects = objectsWithoutValues(s.Objects)
		s.Rollouts = slices.Clone(s.Rollouts)
		for j := range s.Rollouts {
			r := &s.Rollouts[j]
			r.Changes = slices.Clone(r.Changes)
			for k, c := range r.Changes {
				r.Changes[k] = changeWithoutValue(c)
			}
			r.Strategy = ""
		}
	}
	out.Prune = objectsWithoutValues(d.Prune)
	return &out
}

func objectsWithoutValues(objs []ObjectDiff) []ObjectDiff {
	out := slices.Clone(objs)
	for i := range out {
		fields := make([]FieldDiff, len(out[i].Fields))
		for j, f := range out[i].Fields {
			fields[j] = f.withoutValue()
		}
		if out[i].Fields == nil {
			fields = nil
		}
		out[i].Fields = fields
	}
	return out
}

// changeWithoutValue is a rollout's change ("version: v1.34.1 -> v1.35.4")
// as the field alone ("version: (changed)").
func changeWithoutValue(c string) string {
	if field, _, ok := strings.Cut(c, ": "); ok {
		return field + ": (changed)"
	}
	if strings.HasPrefix(c, "new LCMCluster") {
		return "new LCMCluster"
	}
	return "(changed)"
}
