package stages_test

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

func TestProfilesListsDefault(t *testing.T) {
	names := stages.Profiles()
	if !slices.Contains(names, stages.DefaultProfile) {
		t.Errorf("Profiles() = %v, want it to hold %q", names, stages.DefaultProfile)
	}
	if !slices.IsSorted(names) {
		t.Errorf("Profiles() = %v, want alphabetical order", names)
	}
}

// TestBuiltInProfiles checks every built-in profile as a user would meet
// it: it parses strictly, is named after its file, describes itself, and
// makes a plan whose readiness checks compile.
func TestBuiltInProfiles(t *testing.T) {
	for _, name := range stages.Profiles() {
		t.Run(name, func(t *testing.T) {
			p, err := stages.LoadProfile(name)
			if err != nil {
				t.Fatalf("LoadProfile: %v", err)
			}
			if p.Name != name {
				t.Errorf("profile file %s.yaml is named %q inside", name, p.Name)
			}
			if p.Description == "" {
				t.Errorf("profile %s has no description", name)
			}
			if len(p.Stages) == 0 {
				t.Fatalf("profile %s has no stages", name)
			}
			if _, err := stages.BuildPlan(p.Stages, nil); err != nil {
				t.Errorf("profile %s makes no plan: %v", name, err)
			}
			for _, s := range p.Stages {
				if _, err := stages.NewChecker(s.ReadyWhen); err != nil {
					t.Errorf("stage %s: %v", s.Name, err)
				}
			}
			yaml, err := stages.ProfileYAML(name)
			if err != nil || len(yaml) == 0 {
				t.Errorf("ProfileYAML(%q) = %d bytes, %v", name, len(yaml), err)
			}
		})
	}
}

// TestDefaultProfileAppliesEverything pins what a deployment without stages
// gets: one apply stage that owns every object, whatever its kind.
func TestDefaultProfileAppliesEverything(t *testing.T) {
	p, err := stages.LoadProfile(stages.DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	objects := []*unstructured.Unstructured{
		object("v1", "Namespace", "", "team"),
		object("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", "widgets.test.capstan.dev"),
		object("test.capstan.dev/v1alpha1", "Widget", "team", "w"),
	}
	plan, err := stages.BuildPlan(p.Stages, objects)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Stages) != 1 || plan.Stages[0].Action != capstanv1.StageActionApply || len(plan.Stages[0].Objects) != len(objects) {
		t.Errorf("default profile plan = %v, want one apply stage holding all %d objects", planRefs(plan), len(objects))
	}
}

func TestLoadProfileUnknown(t *testing.T) {
	_, err := stages.LoadProfile("nonesuch")
	if err == nil {
		t.Fatal("LoadProfile(nonesuch) succeeded")
	}
	want := `profile "nonesuch" is not built in (built-in: ` + strings.Join(stages.Profiles(), ", ") + ")"
	if err.Error() != want {
		t.Errorf("error = %q, want %q", err, want)
	}
}

func TestStageSpecs(t *testing.T) {
	explicit := []capstanv1.StageSpec{{Name: "Mine", Select: everything}}
	defaultProfile, err := stages.LoadProfile(stages.DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		spec    capstanv1.ClusterDeploymentSpec
		want    []capstanv1.StageSpec
		wantErr string
	}{
		{
			name: "explicit stages win over a profile",
			spec: capstanv1.ClusterDeploymentSpec{Profile: "nonesuch", Stages: explicit},
			want: explicit,
		},
		{
			name: "a named profile gives its stages",
			spec: capstanv1.ClusterDeploymentSpec{Profile: stages.DefaultProfile},
			want: defaultProfile.Stages,
		},
		{
			name: "neither gives the default profile",
			spec: capstanv1.ClusterDeploymentSpec{},
			want: defaultProfile.Stages,
		},
		{
			name:    "an unknown profile names the field and the built-in profiles",
			spec:    capstanv1.ClusterDeploymentSpec{Profile: "nonesuch"},
			wantErr: `spec.profile: profile "nonesuch" is not built in (built-in: ` + strings.Join(stages.Profiles(), ", ") + ")",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := stages.StageSpecs(tc.spec)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if names(got) != names(tc.want) {
				t.Errorf("stages = %s, want %s", names(got), names(tc.want))
			}
		})
	}
}

func names(specs []capstanv1.StageSpec) string {
	var n []string
	for _, s := range specs {
		n = append(n, s.Name+"("+string(s.Action)+")")
	}
	return strings.Join(n, ", ")
}
