package stages

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

//go:embed profiles/*.yaml
var profileFiles embed.FS

// DefaultProfile is the plan used when a deployment names neither a profile
// nor stages.
const DefaultProfile = "default"

// Profile is a built-in, named stage plan.
type Profile struct {
	Name        string                `json:"name"`
	Description string                `json:"description"`
	Stages      []capstanv1.StageSpec `json:"stages"`
}

// Profiles lists the built-in profile names in alphabetical order.
func Profiles() []string {
	entries, _ := fs.ReadDir(profileFiles, "profiles")
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), path.Ext(e.Name())))
	}
	sort.Strings(names)
	return names
}

// ProfileYAML returns the YAML text of a built-in profile, as embedded.
func ProfileYAML(name string) ([]byte, error) {
	data, err := profileFiles.ReadFile("profiles/" + name + ".yaml")
	if err != nil {
		return nil, fmt.Errorf("profile %q is not built in (built-in: %s)", name, strings.Join(Profiles(), ", "))
	}
	return data, nil
}

// LoadProfile parses a built-in profile.
func LoadProfile(name string) (*Profile, error) {
	data, err := ProfileYAML(name)
	if err != nil {
		return nil, err
	}
	var p Profile
	if err := yaml.UnmarshalStrict(data, &p); err != nil {
		return nil, fmt.Errorf("parse built-in profile %q: %w", name, err)
	}
	return &p, nil
}

// StageSpecs returns the stages a deployment asks for: its explicit stages,
// else its profile's, else the default profile's. Rollout stages get the
// deployment's rollout policy where they set nothing else.
func StageSpecs(spec capstanv1.ClusterDeploymentSpec) ([]capstanv1.StageSpec, error) {
	if len(spec.Stages) > 0 {
		return withRolloutPolicy(spec.Stages, spec.Rollout), nil
	}
	name := spec.Profile
	if name == "" {
		name = DefaultProfile
	}
	p, err := LoadProfile(name)
	if err != nil {
		return nil, fmt.Errorf("spec.profile: %w", err)
	}
	return withRolloutPolicy(p.Stages, spec.Rollout), nil
}
