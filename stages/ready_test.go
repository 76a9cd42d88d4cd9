package stages_test

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// live builds an object as read from the cluster: content is merged over
// apiVersion, kind and metadata.name.
func live(apiVersion, kind, name string, content map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	for k, v := range content {
		u.Object[k] = v
	}
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
	u.SetName(name)
	return u
}

func widgetWithStatus(status map[string]any) *unstructured.Unstructured {
	content := map[string]any{"spec": map[string]any{"size": int64(1)}}
	if status != nil {
		content["status"] = status
	}
	return live("test.capstan.dev/v1alpha1", "Widget", "w", content)
}

func checks(c ...capstanv1.ReadinessCheck) []capstanv1.ReadinessCheck { return c }

func readyCEL(expr string) capstanv1.ReadinessCheck { return capstanv1.ReadinessCheck{CEL: expr} }

// readinessCases pin Checker.Evaluate: whether the object is ready and, when
// it is not, words its message must hold.
var readinessCases = []struct {
	name        string
	checks      []capstanv1.ReadinessCheck
	obj         *unstructured.Unstructured
	wantReady   bool
	wantMessage []string
}{
	{
		name:      "CEL true is ready",
		checks:    checks(readyCEL("object.status.ready == true")),
		obj:       widgetWithStatus(map[string]any{"ready": true}),
		wantReady: true,
	},
	{
		name:        "CEL false is not ready and says what it waits for",
		checks:      checks(readyCEL("object.status.ready == true")),
		obj:         widgetWithStatus(map[string]any{"ready": false}),
		wantMessage: []string{"waiting for object.status.ready == true"},
	},
	{
		name:        "CEL false shows the check's own message",
		checks:      checks(capstanv1.ReadinessCheck{CEL: "object.status.ready", Message: "widget is being assembled"}),
		obj:         widgetWithStatus(map[string]any{"ready": false}),
		wantMessage: []string{"widget is being assembled"},
	},
	{
		name:        "missing field is not ready with a message, not an error",
		checks:      checks(readyCEL("object.status.ready == true")),
		obj:         widgetWithStatus(nil),
		wantMessage: []string{"waiting for object.status.ready == true", "no such key: status"},
	},
	{
		name:        "dynamic expression returning a non-bool is not ready",
		checks:      checks(readyCEL("object.spec.size")),
		obj:         widgetWithStatus(nil),
		wantMessage: []string{"returned 1, expected bool"},
	},
	{
		name: "conditions are reachable with macros",
		checks: checks(readyCEL(
			"object.status.conditions.exists(c, c.type == 'Ready' && c.status == 'True')")),
		obj:       widgetWithStatus(map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "True"}}}),
		wantReady: true,
	},
	{
		name:      "every check must hold",
		checks:    checks(readyCEL("object.spec.size >= 1"), capstanv1.ReadinessCheck{CEL: "object.status.ready", Message: "second check"}),
		obj:       widgetWithStatus(map[string]any{"ready": false}),
		wantReady: false, wantMessage: []string{"second check"},
	},
	{
		name:      "check for another kind does not apply; kstatus decides",
		checks:    checks(capstanv1.ReadinessCheck{Kind: "Gadget", CEL: "false"}),
		obj:       widgetWithStatus(nil),
		wantReady: true,
	},
	{
		name:        "check for the object's group/Kind applies",
		checks:      checks(capstanv1.ReadinessCheck{Kind: "test.capstan.dev/Widget", CEL: "object.status.ready == true"}),
		obj:         widgetWithStatus(map[string]any{"ready": false}),
		wantMessage: []string{"waiting for object.status.ready == true"},
	},
	{
		name:      "check for the same Kind in another group does not apply",
		checks:    checks(capstanv1.ReadinessCheck{Kind: "other.example.com/Widget", CEL: "false"}),
		obj:       widgetWithStatus(nil),
		wantReady: true,
	},
	{
		name:      "kstatus: ConfigMap is Current",
		obj:       live("v1", "ConfigMap", "cm", map[string]any{"data": map[string]any{"a": "b"}}),
		wantReady: true,
	},
	{
		name: "kstatus: a custom resource with Ready=False is not ready",
		obj: widgetWithStatus(map[string]any{"conditions": []any{map[string]any{
			"type": "Ready", "status": "False", "reason": "Assembling", "message": "2 of 3 parts",
		}}}),
		wantMessage: []string{"InProgress", "2 of 3 parts"},
	},
	{
		name: "kstatus: a custom resource with Ready=True is ready",
		obj: widgetWithStatus(map[string]any{"conditions": []any{map[string]any{
			"type": "Ready", "status": "True",
		}}}),
		wantReady: true,
	},
	{
		name: "kstatus: a custom resource with Stalled=True is not ready",
		obj: widgetWithStatus(map[string]any{"conditions": []any{map[string]any{
			"type": "Stalled", "status": "True", "message": "out of parts",
		}}}),
		wantMessage: []string{"Failed", "out of parts"},
	},
	{
		name: "kstatus: a Deployment whose observedGeneration is behind is not ready",
		obj: live("apps/v1", "Deployment", "web", map[string]any{
			"metadata": map[string]any{"name": "web", "generation": int64(3)},
			"spec":     map[string]any{"replicas": int64(1)},
			"status": map[string]any{
				"observedGeneration": int64(2), "replicas": int64(1), "updatedReplicas": int64(1),
				"readyReplicas": int64(1), "availableReplicas": int64(1),
			},
		}),
		wantMessage: []string{"InProgress", "generation is 3", "observed generation is 2"},
	},
	{
		name: "kstatus: a Deployment that is rolled out is ready",
		obj: live("apps/v1", "Deployment", "web", map[string]any{
			"metadata": map[string]any{"name": "web", "generation": int64(3)},
			"spec":     map[string]any{"replicas": int64(1)},
			"status": map[string]any{
				"observedGeneration": int64(3), "replicas": int64(1), "updatedReplicas": int64(1),
				"readyReplicas": int64(1), "availableReplicas": int64(1),
				"conditions": []any{map[string]any{"type": "Available", "status": "True"}},
			},
		}),
		wantReady: true,
	},
	{
		name:        "kstatus: an object being deleted is not ready",
		obj:         live("v1", "ConfigMap", "cm", map[string]any{"metadata": map[string]any{"name": "cm", "deletionTimestamp": "2026-01-01T00:00:00Z"}}),
		wantMessage: []string{"Terminating"},
	},
	{
		name:        "nested comprehensions stop at the cost limit, not ready",
		checks:      checks(readyCEL(nestedComprehension(7))),
		obj:         widgetWithStatus(nil),
		wantMessage: []string{"cost limit exceeded"},
	},
	{
		name:        "a huge list stops at the cost limit, not ready",
		checks:      checks(readyCEL("lists.range(1000000).size() > 0")),
		obj:         widgetWithStatus(nil),
		wantMessage: []string{"cost limit exceeded"},
	},
	{
		name: "messageExpression adds the live detail to the message",
		checks: checks(capstanv1.ReadinessCheck{CEL: "object.status.ready == true", Message: "waiting for the widget",
			MessageExpression: "object.status.conditions.filter(c, c.status != 'True').map(c, c.message).join('; ')"}),
		obj: widgetWithStatus(map[string]any{"ready": false, "conditions": []any{
			map[string]any{"type": "A", "status": "True", "message": "fine"},
			map[string]any{"type": "B", "status": "False", "message": "host node-2 is provisioning"},
		}}),
		wantMessage: []string{"waiting for the widget: host node-2 is provisioning"},
	},
	{
		name: "a messageExpression that fails adds nothing",
		checks: checks(capstanv1.ReadinessCheck{CEL: "object.status.ready == true", Message: "waiting for the widget",
			MessageExpression: "object.status.missing.message"}),
		obj:         widgetWithStatus(map[string]any{"ready": false}),
		wantMessage: []string{"waiting for the widget"},
	},
}

// nestedComprehension is depth comprehensions over ten elements, nested:
// 10^depth evaluations of the innermost sum.
func nestedComprehension(depth int) string {
	vars := make([]string, depth)
	for i := range vars {
		vars[i] = fmt.Sprintf("v%d", i)
	}
	expr := strings.Join(vars, " + ") + " >= 0"
	for i := depth - 1; i >= 0; i-- {
		expr = fmt.Sprintf("lists.range(10).all(%s, %s)", vars[i], expr)
	}
	return expr
}

func TestCheckerEvaluate(t *testing.T) {
	for _, tc := range readinessCases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := stages.NewChecker(tc.checks)
			if err != nil {
				t.Fatalf("NewChecker: %v", err)
			}
			v := c.Evaluate(tc.obj)
			if v.Ready != tc.wantReady {
				t.Fatalf("Evaluate = %+v, want ready %v", v, tc.wantReady)
			}
			if v.Ready && v.Message != "" {
				t.Errorf("ready verdict has a message: %q", v.Message)
			}
			for _, want := range tc.wantMessage {
				if !strings.Contains(v.Message, want) {
					t.Errorf("message %q does not mention %q", v.Message, want)
				}
			}
		})
	}
}

// TestCheckerEvaluateLeavesObjectAlone pins that Evaluate is a pure function
// of the object: evaluating twice gives the same verdict and does not
// change the object.
func TestCheckerEvaluateLeavesObjectAlone(t *testing.T) {
	c, err := stages.NewChecker(checks(readyCEL("object.status.ready == true")))
	if err != nil {
		t.Fatal(err)
	}
	obj := widgetWithStatus(map[string]any{"ready": false})
	before := obj.DeepCopy()
	first, second := c.Evaluate(obj), c.Evaluate(obj)
	if first != second {
		t.Errorf("Evaluate gave %+v, then %+v", first, second)
	}
	if !equalObjects(before, obj) {
		t.Errorf("Evaluate changed the object: %v, was %v", obj.Object, before.Object)
	}
}

func equalObjects(a, b *unstructured.Unstructured) bool {
	ja, errA := a.MarshalJSON()
	jb, errB := b.MarshalJSON()
	return errA == nil && errB == nil && string(ja) == string(jb)
}

func TestNewCheckerRejects(t *testing.T) {
	cases := []struct {
		name    string
		checks  []capstanv1.ReadinessCheck
		wantErr []string
	}{
		{
			name:    "expression returning an int",
			checks:  checks(readyCEL("1 + 1")),
			wantErr: []string{"readyWhen[0].cel", "returns int, expected bool"},
		},
		{
			name:    "expression returning a string",
			checks:  checks(readyCEL("object.metadata.name + 'x'")),
			wantErr: []string{"readyWhen[0].cel", "expected bool"},
		},
		{
			name:    "messageExpression returning a bool",
			checks:  checks(capstanv1.ReadinessCheck{CEL: "true", MessageExpression: "1 == 1"}),
			wantErr: []string{"readyWhen[0].messageExpression", "expected string"},
		},
		{
			name:    "syntax error",
			checks:  checks(readyCEL("object.status.ready ==")),
			wantErr: []string{"readyWhen[0].cel", "Syntax error"},
		},
		{
			name:    "unknown variable",
			checks:  checks(readyCEL("self.status.ready")),
			wantErr: []string{"readyWhen[0].cel", "undeclared reference to 'self'"},
		},
		{
			name:    "every bad expression is reported with its index",
			checks:  checks(readyCEL("true"), readyCEL("1"), readyCEL("object.x"), readyCEL("'s'")),
			wantErr: []string{"readyWhen[1].cel", "readyWhen[3].cel"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := stages.NewChecker(tc.checks)
			if err == nil {
				t.Fatalf("NewChecker succeeded, want an error")
			}
			if c != nil {
				t.Errorf("NewChecker returned a checker with its error")
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error does not mention %q:\n%v", want, err)
				}
			}
			if strings.Contains(err.Error(), "readyWhen[2]") {
				t.Errorf("error blames a dynamic expression that may well be bool:\n%v", err)
			}
		})
	}
}

// BenchmarkCheckerEvaluate measures one CEL check on one object, the work
// done per watch event.
func BenchmarkCheckerEvaluate(b *testing.B) {
	c, err := stages.NewChecker(checks(readyCEL(
		"object.status.conditions.exists(c, c.type == 'Ready' && c.status == 'True')")))
	if err != nil {
		b.Fatal(err)
	}
	obj := widgetWithStatus(map[string]any{"conditions": []any{
		map[string]any{"type": "Progressing", "status": "True"},
		map[string]any{"type": "Ready", "status": "True"},
	}})
	for b.Loop() {
		if !c.Evaluate(obj).Ready {
			b.Fatal("not ready")
		}
	}
}

// A messageExpression that fails, or returns "", leaves the message exactly
// as written; one that returns text appends it after ": ".
func TestMessageExpressionDetail(t *testing.T) {
	obj := widgetWithStatus(map[string]any{"ready": false, "phase": "provisioning"})
	for _, tc := range []struct{ expr, want string }{
		{"object.status.missing.message", "waiting for the widget"},
		{"''", "waiting for the widget"},
		{"'phase ' + object.status.phase", "waiting for the widget: phase provisioning"},
	} {
		c, err := stages.NewChecker(checks(capstanv1.ReadinessCheck{CEL: "object.status.ready == true",
			Message: "waiting for the widget", MessageExpression: tc.expr}))
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Evaluate(obj).Message; got != tc.want {
			t.Errorf("messageExpression %s: message %q, want %q", tc.expr, got, tc.want)
		}
	}
}

// A readiness check never sees a Secret's values, so no message can carry
// one: not through messageExpression, not through an error that quotes
// the object.
func TestCheckerHidesSecretData(t *testing.T) {
	secret := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Secret",
		"metadata":   map[string]any{"name": "creds", "namespace": "ns"},
		"data":       map[string]any{"password": "cGxhbnRlZC1zZWNyZXQ="}, // planted-secret
		"stringData": map[string]any{"token": "planted-token"},
	}}
	c, err := stages.NewChecker([]capstanv1.ReadinessCheck{{
		Kind: "Secret", CEL: "has(object.data) && object.data.password == ''",
		MessageExpression: "string(object.data) + string(object.stringData)",
	}, {
		Kind: "Secret", CEL: "object.data.password.size() == 0",
	}})
	if err != nil {
		t.Fatal(err)
	}
	v := c.Evaluate(secret)
	if v.Ready {
		t.Fatalf("Evaluate = %+v, want not ready: the checks cannot see data", v)
	}
	for _, planted := range []string{"cGxhbnRlZC1zZWNyZXQ=", "planted-secret", "planted-token"} {
		if strings.Contains(v.Message, planted) {
			t.Errorf("message %q carries the Secret's value %q", v.Message, planted)
		}
	}
	if _, ok := secret.Object["data"]; !ok {
		t.Error("Evaluate removed data from the caller's Secret")
	}
}
