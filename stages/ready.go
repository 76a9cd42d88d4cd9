package stages

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/fluxcd/cli-utils/pkg/kstatus/status"
	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/ext"
	"github.com/google/cel-go/interpreter"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
)

// celCostLimit bounds the work one readiness expression may do on one
// object, so that a user's expression cannot stall the executor.
const celCostLimit = 1_000_000

// Verdict is whether one object is ready, and if not, why.
type Verdict struct {
	Ready   bool
	Message string
	// ReadyObjects is, in the verdict of Wait on several objects, how
	// many of them are ready.
	ReadyObjects int
	// Replicas is, in the verdict of Wait, how many replicas the unready
	// objects that roll them out have up to date (machines of a control
	// plane being upgraded); nil when none does.
	Replicas *capstanv1.StageProgress
	// Err is set when the checks cannot judge the object at all, however
	// long it waits: an expression over the CEL cost limit on it. It is a
	// stalled failure with reason ReadinessCheckFailed.
	Err error
}

// Checker judges readiness. It is a pure function of the object: it reads
// nothing but the object it is given.
type Checker struct {
	checks []compiledCheck
	// readAs is, by group and kind, the version the checks of that kind
	// are written for (ReadinessCheck.APIVersion).
	readAs map[schema.GroupKind]string
}

// ReadAs is the group, version and kind the checks read an object of gvk
// in: the version a check of its kind names, else gvk itself.
func (c *Checker) ReadAs(gvk schema.GroupVersionKind) schema.GroupVersionKind {
	if v, ok := c.readAs[gvk.GroupKind()]; ok {
		gvk.Version = v
	}
	return gvk
}

type compiledCheck struct {
	kind    string
	expr    string
	message string
	program cel.Program
	// detail, when set, computes the live part of the message.
	detail cel.Program
}

// maxDetail bounds what a messageExpression adds to a stage's message.
const maxDetail = 400

var celEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(
		cel.Variable("object", cel.DynType),
		ext.Strings(),
		ext.Lists(),
	)
})

// NewChecker compiles the readiness checks of a stage. Every expression
// that does not compile or does not return a bool is reported, with its
// index in readyWhen, in one stalled error (ReadinessCheckFailed).
func NewChecker(checks []capstanv1.ReadinessCheck) (*Checker, error) {
	env, err := celEnv()
	if err != nil {
		return nil, fmt.Errorf("create CEL environment: %w", err)
	}
	var errs []error
	c := &Checker{}
	for i, check := range checks {
		ast, iss := env.Compile(check.CEL)
		if iss.Err() != nil {
			errs = append(errs, fmt.Errorf("readyWhen[%d].cel: %w", i, iss.Err()))
			continue
		}
		if ast.OutputType() != types.BoolType && ast.OutputType() != types.DynType {
			errs = append(errs, fmt.Errorf("readyWhen[%d].cel: expression returns %s, expected bool", i, ast.OutputType()))
			continue
		}
		prg, err := env.Program(ast, cel.CostLimit(celCostLimit))
		if err != nil {
			errs = append(errs, fmt.Errorf("readyWhen[%d].cel: %w", i, err))
			continue
		}
		if err := c.readIn(check); err != nil {
			errs = append(errs, fmt.Errorf("readyWhen[%d].apiVersion: %w", i, err))
			continue
		}
		cc := compiledCheck{kind: check.Kind, expr: check.CEL, message: check.Message, program: prg}
		if check.MessageExpression != "" {
			ast, iss := env.Compile(check.MessageExpression)
			if iss.Err() != nil {
				errs = append(errs, fmt.Errorf("readyWhen[%d].messageExpression: %w", i, iss.Err()))
				continue
			}
			if ast.OutputType() != types.StringType && ast.OutputType() != types.DynType {
				errs = append(errs, fmt.Errorf("readyWhen[%d].messageExpression: expression returns %s, expected string", i, ast.OutputType()))
				continue
			}
			if cc.detail, err = env.Program(ast, cel.CostLimit(celCostLimit)); err != nil {
				errs = append(errs, fmt.Errorf("readyWhen[%d].messageExpression: %w", i, err))
				continue
			}
		}
		c.checks = append(c.checks, cc)
	}
	if len(errs) > 0 {
		return nil, failure.Stalled(ReasonReadinessCheckFailed, errors.Join(errs...))
	}
	return c, nil
}

// readIn records the version check reads its kind in, if it names one.
func (c *Checker) readIn(check capstanv1.ReadinessCheck) error {
	if check.APIVersion == "" {
		return nil
	}
	gv, err := schema.ParseGroupVersion(check.APIVersion)
	if err != nil || gv.Version == "" {
		return fmt.Errorf("%q is not a group/version", check.APIVersion)
	}
	group, kind, ok := strings.Cut(check.Kind, "/")
	if !ok || group != gv.Group || kind == "" || kind == "*" {
		return fmt.Errorf("%s needs kind: %s/<Kind>, the kind it reads in that version", check.APIVersion, gv.Group)
	}
	gk := schema.GroupKind{Group: group, Kind: kind}
	if c.readAs == nil {
		c.readAs = map[schema.GroupKind]string{}
	}
	if v, ok := c.readAs[gk]; ok && v != gv.Version {
		return fmt.Errorf("%s: another check reads %s in %s/%s; a stage reads a kind in one version", check.APIVersion, kind, group, v)
	}
	c.readAs[gk] = gv.Version
	return nil
}

// Evaluate judges one live object, in the version its kind's checks
// read it in (ReadAs; an object in another version is not ready). Objects that no CEL check applies to are
// ready when kstatus computes Current. An expression that fails on the
// object (a field not there yet) means not ready, not an error: a status
// field appears only once a controller has written it.
//
// A Secret is judged without its data and stringData: no expression, and
// so no message, can read a Secret's values.
func (c *Checker) Evaluate(obj *unstructured.Unstructured) Verdict {
	obj = withoutSecretData(obj)
	if gvk := obj.GroupVersionKind(); c.ReadAs(gvk) != gvk {
		// The wait reads it in that version; an object handed over in
		// another one is not judged, whatever its fields say there.
		return Verdict{Message: fmt.Sprintf("the checks read %s in %s, not %s; read it in that version",
			gvk.Kind, c.ReadAs(gvk).GroupVersion(), gvk.GroupVersion())}
	}
	applied := false
	for _, check := range c.checks {
		if check.kind != "" && !KindMatches(check.kind, obj) {
			continue
		}
		applied = true
		out, _, err := check.program.Eval(map[string]any{"object": obj.Object})
		if err != nil {
			if overCost(err) {
				return Verdict{Message: check.describe(err.Error()), Err: check.costError(obj, err)}
			}
			return Verdict{Message: check.describe(err.Error())}
		}
		if ok, isBool := out.Value().(bool); !isBool {
			return Verdict{Message: check.describe(fmt.Sprintf("returned %v, expected bool", out.Value()))}
		} else if !ok {
			return Verdict{Message: check.withDetail(obj, check.describe(""))}
		}
	}
	if applied {
		return Verdict{Ready: true}
	}
	res, err := status.Compute(obj)
	if err != nil {
		return Verdict{Message: fmt.Sprintf("compute status: %v", err)}
	}
	if res.Status == status.CurrentStatus {
		return Verdict{Ready: true}
	}
	msg := string(res.Status)
	if res.Message != "" {
		msg += ": " + res.Message
	}
	return Verdict{Message: msg}
}

// overCost reports an evaluation cancelled for passing celCostLimit:
// waiting cannot help, the object only grows.
func overCost(err error) bool {
	var cancelled interpreter.EvalCancelledError
	return errors.As(err, &cancelled) && cancelled.Cause == interpreter.CostLimitExceeded
}

// costError says which expression passed the cost limit on which object,
// and what to do.
func (c compiledCheck) costError(obj *unstructured.Unstructured, err error) error {
	return failure.Stalled(ReasonReadinessCheckFailed, fmt.Errorf(
		"readiness expression %q on %s: %w: it costs more than the CEL cost limit of %d on this object, so it can never be judged; "+
			"make the expression cheaper (no nested loops over lists, filter before map) or check fewer fields",
		c.expr, ObjectRef(obj), err, celCostLimit))
}

func (c compiledCheck) describe(detail string) string {
	msg := c.message
	if msg == "" {
		msg = "waiting for " + c.expr
	}
	if detail != "" {
		msg += " (" + detail + ")"
	}
	return msg
}

// withDetail appends what the check's messageExpression says about obj.
func (c compiledCheck) withDetail(obj *unstructured.Unstructured, msg string) string {
	if c.detail == nil {
		return msg
	}
	out, _, err := c.detail.Eval(map[string]any{"object": obj.Object})
	if err != nil {
		return msg
	}
	detail, ok := out.Value().(string)
	if !ok || detail == "" {
		return msg
	}
	if len(detail) > maxDetail {
		detail = detail[:maxDetail] + "..."
	}
	return msg + ": " + detail
}

// withoutSecretData returns obj, or for a Secret a copy of it without the
// fields that hold its values.
func withoutSecretData(obj *unstructured.Unstructured) *unstructured.Unstructured {
	if obj.GetKind() != "Secret" || obj.GroupVersionKind().Group != "" {
		return obj
	}
	_, hasData := obj.Object["data"]
	_, hasString := obj.Object["stringData"]
	if !hasData && !hasString {
		return obj
	}
	cp := &unstructured.Unstructured{Object: make(map[string]any, len(obj.Object))}
	for k, v := range obj.Object {
		if k != "data" && k != "stringData" {
			cp.Object[k] = v
		}
	}
	return cp
}
