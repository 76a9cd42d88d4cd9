package render

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/fluxcd/pkg/envsubst"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

const (
	// SubstituteAnnotation set to SubstituteDisabled on an object exempts
	// it from ${VAR} substitution, e.g. a ConfigMap holding a shell script.
	SubstituteAnnotation = "capstan.dev/substitute"
	// SubstituteDisabled is the value of SubstituteAnnotation that turns
	// substitution off.
	SubstituteDisabled = "disabled"
)

// Substitution works on the object tree, not on serialized YAML: each
// string that contains "${" is expanded on its own with the bash-like
// syntax of github.com/fluxcd/pkg/envsubst (${VAR}, ${VAR:=default},
// ${VAR:-default}, $${VAR} for a literal). A value therefore can never
// change the structure of an object, however many colons, quotes or
// newlines it holds, and each error names the field it happened in.
//
// To keep `replicas: ${REPLICAS}` working, a string that consists of a
// single ${...} expression becomes an integer or a boolean when its result
// is one in YAML 1.2 core terms (decimal integers without leading zeros;
// true/false in any of YAML's three spellings). Floats stay strings, so
// that a version such as "1.20" is not turned into 1.2; "" stays "".
// Map keys are expanded too but always stay strings.

// wholeExpr matches a string that is exactly one ${...} expression.
var wholeExpr = regexp.MustCompile(`^\$\{[^{}$]*\}$`)

// decimalInt is a YAML 1.2 core integer in decimal, without leading zeros.
var decimalInt = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

// substituteAll substitutes variables in every object that does not opt
// out, then checks that the objects still have an identity and are still
// distinct. files holds the file each object came from, or "". Unset
// variables are returned as unset, their objects substituted for the
// rest; any other problem makes err, which then holds every problem,
// unset variables too, in object order.
func substituteAll(ctx context.Context, objs []*unstructured.Unstructured, files []string, opts Options) (unset []*Error, in []*unstructured.Unstructured, err error) {
	var errs []error
	other := false
	seen := map[string]string{}
	for i, obj := range objs {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		name := objectNameOf(obj)
		if obj.GetAnnotations()[SubstituteAnnotation] != SubstituteDisabled {
			s := &substituter{vars: opts.Substitute}
			out := s.value(obj.Object)
			// Name the object as far as it could be substituted: the
			// user knows it by the name it gets in the cluster.
			name := readIdentity(out.(map[string]interface{})).String()
			failed := false
			for _, fe := range s.errs {
				e := &Error{File: files[i], Object: name, Field: fe.field, Err: fe.err}
				errs = append(errs, e)
				var u *UnsetVariableError
				if errors.As(fe.err, &u) {
					unset = append(unset, e)
					if len(in) == 0 || in[len(in)-1] != obj {
						in = append(in, obj)
					}
					continue
				}
				failed, other = true, true
			}
			if failed {
				continue
			}
			obj.Object = out.(map[string]interface{})
		}
		id := readIdentity(obj.Object)
		for _, f := range [][2]string{{"apiVersion", id.APIVersion}, {"kind", id.Kind}, {"metadata.name", id.Name}} {
			if f[1] == "" {
				other = true
				errs = append(errs, &Error{File: files[i], Object: name, Field: f[0], Err: errors.New("empty after substitution")})
			}
		}
		if prev, dup := seen[id.key()]; dup {
			other = true
			errs = append(errs, &Error{File: files[i], Object: id.String(), Err: fmt.Errorf("after substitution the same object as %s", prev)})
		}
		seen[id.key()] = name
	}
	if other {
		return nil, nil, errors.Join(errs...)
	}
	return unset, in, nil
}

// UnsetVariableError is a ${VAR} without a default whose VAR is not set.
type UnsetVariableError struct {
	// Name is the variable, VAR.
	Name string
}

// Error says which variable and how to give it a value.
func (e *UnsetVariableError) Error() string {
	return fmt.Sprintf("${%s} is not set and has no default: set %s in spec.substitute (or --substitute), or write ${%s:=default}, or ${%s:-} for an empty value",
		e.Name, e.Name, e.Name, e.Name)
}

// fieldError is a substitution error in one field of an object.
type fieldError struct {
	field string
	err   error
}

// substituter expands variables in one object and collects its errors.
type substituter struct {
	vars map[string]string
	errs []fieldError
	// missing is the last variable the current eval found unset.
	missing string
	// path is the field being expanded; it only becomes a string when
	// there is an error, so deep objects do not cost quadratic time.
	path fieldPath
}

func (s *substituter) fail(err error) {
	s.errs = append(s.errs, fieldError{s.path.String(), err})
}

// value returns v with variables expanded; v itself is not modified.
func (s *substituter) value(v interface{}) interface{} {
	switch v := v.(type) {
	case string:
		return s.scalar(v)
	case map[string]interface{}:
		out := make(map[string]interface{}, len(v))
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys) // deterministic errors
		for _, k := range keys {
			s.path = append(s.path, k)
			nk := k
			if strings.Contains(k, "${") {
				var err error
				if nk, err = s.eval(k); err != nil {
					s.fail(fmt.Errorf("key: %w", err))
					nk = k
				}
			}
			if _, dup := out[nk]; dup {
				s.fail(fmt.Errorf("key %q is defined twice after substitution", nk))
			}
			out[nk] = s.value(v[k])
			s.path = s.path[:len(s.path)-1]
		}
		return out
	case []interface{}:
		out := make([]interface{}, len(v))
		for i, item := range v {
			s.path = append(s.path, i)
			out[i] = s.value(item)
			s.path = s.path[:len(s.path)-1]
		}
		return out
	}
	return v
}

// scalar expands one string value.
func (s *substituter) scalar(v string) interface{} {
	if !strings.Contains(v, "${") {
		return v
	}
	out, err := s.eval(v)
	if err != nil {
		s.fail(err)
		return v
	}
	if !wholeExpr.MatchString(v) {
		return out
	}
	switch out {
	case "true", "True", "TRUE":
		return true
	case "false", "False", "FALSE":
		return false
	}
	if decimalInt.MatchString(out) {
		if i, err := strconv.ParseInt(out, 10, 64); err == nil {
			return i
		}
	}
	return out
}

// eval runs envsubst, which is third-party string surgery on user input,
// so a panic becomes an error. Substitution is strict: a ${VAR} without a
// default whose VAR is not set fails, as an *UnsetVariableError; the
// default operators (${VAR:=x}, ${VAR:-}, ...) take the unset case.
func (s *substituter) eval(in string) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("substitution panicked: %v", r)
		}
	}()
	s.missing = ""
	out, err = envsubst.Eval(in, s.lookup)
	if err != nil && s.missing != "" {
		return "", &UnsetVariableError{Name: s.missing}
	}
	return out, err
}

// lookup gives envsubst a variable's value, and remembers an unset one:
// envsubst fails on it unless a default operator takes it.
func (s *substituter) lookup(name string) (string, bool) {
	v, ok := s.vars[name]
	if !ok {
		s.missing = name
	}
	return v, ok
}

// fieldPath is a path into an object: map keys (string) and list indexes
// (int).
type fieldPath []interface{}

// String renders the path as "spec.items[2].name".
func (p fieldPath) String() string {
	var b strings.Builder
	for _, e := range p {
		switch e := e.(type) {
		case int:
			fmt.Fprintf(&b, "[%d]", e)
		default:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			fmt.Fprint(&b, e)
		}
	}
	return b.String()
}
