package preflight

import (
	"errors"
	"fmt"
	"strings"
)

// Problem is one thing wrong with the rendered objects.
type Problem struct {
	// Object names the object as `Kind namespace/name` (`Kind name` when
	// it has no namespace).
	Object string `json:"object"`
	// Field is the path of the offending field, like `data.podCIDR` or
	// `spec.pools[0].start`.
	Field string `json:"field"`
	// Message says what is wrong and what was expected.
	Message string `json:"message"`
	// Warning marks a problem that is reported but does not fail the
	// validation.
	Warning bool `json:"warning,omitempty"`
}

// Error returns the problem as `Object: field: message`.
func (p Problem) Error() string {
	return p.Object + ": " + p.Field + ": " + p.Message
}

// Line returns the problem as one line of a report, led by its severity:
// `ERROR Object: field: message` or `WARNING ...`.
func (p Problem) Line() string {
	if p.Warning {
		return "WARNING " + p.Error()
	}
	return "ERROR " + p.Error()
}

// Report is the outcome of Validate: every problem found, in the order of
// the objects, and the network settings the checks used.
type Report struct {
	// Checked names the objects the checks read (network ConfigMaps,
	// Clusters, IPPools), so that an object left out, say a ConfigMap
	// without the label, shows.
	Checked []string `json:"checked"`
	// Problems are every problem found, grouped by object.
	Problems []Problem `json:"problems"`
	// Networks are the settings each network ConfigMap or, without one,
	// each Cluster defines, defaults filled in.
	Networks []Network `json:"networks,omitempty"`
}

// Network is the network settings one object defines, after defaulting.
// Values that do not parse are left out.
type Network struct {
	Object             string   `json:"object"`
	ControlPlaneCIDRs  []string `json:"controlPlaneCIDRs,omitempty"`
	WorkloadPlaneCIDRs []string `json:"workloadPlaneCIDRs,omitempty"`
	PodCIDRs           []string `json:"podCIDRs,omitempty"`
	ServiceCIDRs       []string `json:"serviceCIDRs,omitempty"`
}

// Errors returns the problems that fail the validation.
func (r Report) Errors() []Problem { return r.filter(false) }

// Warnings returns the problems that are only reported.
func (r Report) Warnings() []Problem { return r.filter(true) }

func (r Report) filter(warning bool) []Problem {
	var out []Problem
	for _, p := range r.Problems {
		if p.Warning == warning {
			out = append(out, p)
		}
	}
	return out
}

// Err joins the errors of the report, one line per problem, or returns nil
// when there are none: warnings alone pass. errors.As finds each Problem.
func (r Report) Err() error {
	var errs []error
	for _, p := range r.Errors() {
		errs = append(errs, p)
	}
	return errors.Join(errs...)
}

// Summary counts the problems, like "2 errors, 1 warning".
func (r Report) Summary() string {
	return count(len(r.Errors()), "error") + ", " + count(len(r.Warnings()), "warning")
}

// Lines returns the report as text, one Problem.Line per problem.
func (r Report) Lines() string {
	var b strings.Builder
	for _, p := range r.Problems {
		b.WriteString(p.Line())
		b.WriteByte('\n')
	}
	return b.String()
}

func count(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// problems collects the problems of one validation.
type problems struct {
	list []Problem
}

func (p *problems) errorf(object, field, format string, args ...any) {
	p.list = append(p.list, Problem{Object: object, Field: field, Message: fmt.Sprintf(format, args...)})
}

func (p *problems) warnf(object, field, format string, args ...any) {
	p.list = append(p.list, Problem{Object: object, Field: field, Message: fmt.Sprintf(format, args...), Warning: true})
}
