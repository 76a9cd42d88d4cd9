package render

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"
)

func isClusterDeployment(apiVersion, kind string) bool {
	return strings.HasPrefix(apiVersion, "capstan.dev/") && kind == "ClusterDeployment"
}

func TestLoadManifests(t *testing.T) {
	fsys := os.DirFS("testdata/manifests")
	for _, tc := range []struct {
		name string
		dir  string
		keep func(apiVersion, kind string) bool
		want []string
	}{
		{
			name: "finds ClusterDeployments among other YAML, skipping kustomization and hidden files",
			dir:  ".",
			keep: isClusterDeployment,
			want: []string{"ClusterDeployment/capstan-system/edge-1", "ClusterDeployment/capstan-system/edge-2", "ClusterDeployment/capstan-system/mgmt"},
		},
		{
			name: "looks only below dir",
			dir:  "./clusters/mgmt",
			keep: isClusterDeployment,
			want: []string{"ClusterDeployment/capstan-system/mgmt"},
		},
		{
			name: "keep decides before documents are judged",
			dir:  "clusters/mgmt",
			keep: func(_, kind string) bool { return kind == "ConfigMap" },
			want: []string{"ConfigMap/unrelated"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := LoadManifests(fsys, tc.dir, tc.keep)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, obj := range objs {
				got = append(got, objectNameOf(obj))
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestLoadManifestsWithoutKeepWantsObjectsEverywhere(t *testing.T) {
	_, err := LoadManifests(os.DirFS("testdata/manifests"), "clusters/edge", nil)
	want := "clusters/edge/values/values.yaml: document 1: apiVersion: required"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want %q", err, want)
	}
}

func TestLoadManifestsErrors(t *testing.T) {
	objs, err := LoadManifests(os.DirFS("testdata/manifests-bad"), ".", isClusterDeployment)
	var got []string
	for _, e := range renderErrors(err) {
		got = append(got, e.Error())
	}
	want := []string{
		"a.yaml: document 2: metadata.name: required",
		"b.yaml: ClusterDeployment/ok: object defined twice, also in a.yaml (document 1)",
		// yaml.v3 reports the line its parser context started on, not
		// where the problem is; only the rest is ours to pin.
		"c.yaml: invalid YAML: document 1: yaml: line ",
	}
	if len(got) == len(want) && strings.HasPrefix(got[2], want[2]) {
		got[2] = want[2]
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(objs) != 1 || objs[0].GetName() != "ok" {
		t.Errorf("got %d objects, want the one that loaded fine", len(objs))
	}
}

func TestLoadManifestsRefusesPathsOutsideTheArtifact(t *testing.T) {
	if _, err := LoadManifests(os.DirFS("testdata/manifests"), "../repo", nil); err == nil {
		t.Fatal("no error")
	}
}

// A manifest file too large to be ClusterDeployments is reported, never
// read whole, and the other files still load.
func TestLoadManifestsRefusesAnOversizedFile(t *testing.T) {
	fsys := fstest.MapFS{
		"clusters/a.yaml":   {Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n")},
		"clusters/big.yaml": {Data: []byte(strings.Repeat("#", int(DefaultMaxFileBytes)+1))},
	}
	objs, err := LoadManifests(fsys, "clusters", nil)
	if err == nil || !strings.Contains(err.Error(), "clusters/big.yaml: 8388609 bytes, more than 8MiB") || !errors.Is(err, ErrLimit) {
		t.Fatalf("got %v, want a limit error naming clusters/big.yaml", err)
	}
	if len(objs) != 1 {
		t.Errorf("got %d objects, want the one of a.yaml", len(objs))
	}
}
