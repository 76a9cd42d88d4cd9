package render

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

// repo is the artifact most tests render from.
var repo = os.DirFS("testdata/repo")

// bad holds one broken overlay per directory.
var bad = os.DirFS("testdata/bad")

// marshalObjects renders objects as a YAML stream, the golden file format.
func marshalObjects(t *testing.T, objs []*unstructured.Unstructured) []byte {
	t.Helper()
	var buf bytes.Buffer
	for i, obj := range objs {
		if i > 0 {
			buf.WriteString("---\n")
		}
		data, err := yaml.Marshal(obj.Object)
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(data)
	}
	return buf.Bytes()
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	file := filepath.Join("testdata", "golden", name)
	if *update {
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (run go test ./render -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the rendered output (run go test ./render -update after checking):\n--- got\n%s", file, got)
	}
}

func build(t *testing.T, fsys fs.FS, p string) ([]*unstructured.Unstructured, error) {
	t.Helper()
	opts := DefaultOptions()
	opts.Path = p
	return Build(context.Background(), fsys, opts)
}

func TestBuildGolden(t *testing.T) {
	for _, tc := range []struct {
		name, path, golden string
	}{
		{"base and overlay with patches and a ConfigMap generator", "./clusters/mgmt", "mgmt.yaml"},
		{"directory without kustomization gets one like Flux's", "clusters/plain", "plain.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := build(t, repo, tc.path)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, tc.golden, marshalObjects(t, objs))
		})
	}
}

// renderErrors flattens the errors.Join tree of err into its *Error leaves.
func renderErrors(err error) []*Error {
	var out []*Error
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		var re *Error
		if errors.As(err, &re) {
			out = append(out, re)
		}
	}
	walk(err)
	return out
}

// brokenOverlays pins what a user sees for each kind of mistake: every line
// of want must appear, in order, as one joined error each.
var brokenOverlays = []struct {
	name string
	path string
	want []string
	is   error
}{
	{
		name: "missing resource names the kustomization file and the entry",
		path: "missing",
		want: []string{
			`missing/kustomization.yaml: resources[1]: "missing.yaml": no such file or directory in the artifact`,
			`missing/kustomization.yaml: resources[2]: "./missing-dir": no such file or directory in the artifact`,
		},
		is: fs.ErrNotExist,
	},
	{
		name: "unknown kustomization field names the file",
		path: "unknownfield",
		want: []string{`unknownfield/kustomization.yaml: invalid kustomization: json: unknown field "resourcez"`},
	},
	{
		name: "YAML syntax error names the file, the document and the line",
		path: "syntax",
		want: []string{`syntax/bad.yaml: invalid YAML: document 2: yaml: line `},
	},
	{
		name: "documents that are not objects are named by file and index",
		path: "identity",
		want: []string{
			`identity/objects.yaml: document 2: metadata.name: required`,
			`identity/objects.yaml: document 3: apiVersion: required`,
			`identity/objects.yaml: document 3: kind: required`,
			`identity/objects.yaml: document 4: document is not a mapping, so not a Kubernetes object`,
		},
	},
	{
		name: "object defined twice names both files",
		path: "duplicate",
		want: []string{`duplicate/b.yaml: ConfigMap/default/twice: object defined twice, also in duplicate/a.yaml (document 1)`},
	},
	{
		name: "a file listed twice names both entries",
		path: "listedtwice",
		want: []string{`listedtwice/kustomization.yaml: resources[1]: "./cm.yaml" is listed twice, also as resources[0]`},
	},
	{
		name: "remote resources, components, patches and generator files are refused",
		path: "remote",
		want: []string{
			`remote/kustomization.yaml: resources[0]: "https://raw.githubusercontent.com/example/repo/main/deploy.yaml": remote resources are not supported`,
			`remote/kustomization.yaml: resources[1]: "github.com/example/repo//deploy?ref=v1.0.0": remote resources are not supported`,
			`remote/kustomization.yaml: resources[2]: "git@github.com:example/repo.git": remote resources are not supported`,
			`remote/kustomization.yaml: components[0]: "ssh://git@example.com/example/components": remote resources are not supported`,
			`remote/kustomization.yaml: patches[0].path: "http://example.com/patch.yaml": remote resources are not supported`,
			`remote/kustomization.yaml: configMapGenerator[0].files[0]: "https://example.com/settings.env": remote resources are not supported`,
		},
		is: ErrRemote,
	},
	{
		name: "a builtin plugin config cannot make kustomize fetch a URL",
		path: "remote-plugin",
		want: []string{`remote-plugin/patch-transformer.yaml: PatchTransformer/fetches: path: "https://example.com/patch.yaml": remote resources are not supported`},
		is:   ErrRemote,
	},
	{
		name: "exec and KRM function plugins are refused",
		path: "plugin",
		want: []string{
			`plugin/kustomization.yaml: generators[0]: KRMGenerator/fn: apiVersion: only kustomize's builtin plugins`,
			`plugin/exec-plugin.yaml: SedTransformer/sed: apiVersion: only kustomize's builtin plugins`,
		},
		is: ErrPlugin,
	},
	{
		name: "a kustomization of plugin configs cannot rewrite them into URLs",
		path: "plugin-dir",
		want: []string{
			`plugin-dir/transformers/kustomization.yaml: configurations: not allowed in a kustomization used as generators, transformers or validators`,
			`plugin-dir/transformers/kustomization.yaml: namePrefix: "https:": remote resources are not supported`,
		},
		is: ErrRemote,
	},
	{
		name: "helm charts are refused",
		path: "helm",
		want: []string{`helm/kustomization.yaml: helmCharts: helm chart inflation is not supported`},
		is:   ErrHelm,
	},
	{
		name: "entries cannot leave the artifact or the kustomization's directory",
		path: "escape/inner",
		want: []string{
			`escape/inner/kustomization.yaml: resources[0]: "../../../../../etc": leaves the artifact root`,
			`escape/inner/kustomization.yaml: resources[1]: "../outside.yaml": file is outside the kustomization's directory`,
			`escape/inner/kustomization.yaml: resources[2]: "/etc/passwd": absolute paths are not allowed`,
		},
	},
	{
		name: "kustomization cycles are found before kustomize recurses forever",
		path: "cycle/a",
		want: []string{`cycle/a/kustomization.yaml: kustomization cycle: cycle/a -> cycle/b -> cycle/a`},
	},
	{
		name: "a directory with nothing to render is an error, not an empty result",
		path: "nomanifests",
		want: []string{`nomanifests: no kustomization file and no YAML files to generate one from`},
	},
	{
		name: "an alias bomb is refused before kustomize expands it",
		path: "aliasbomb",
		want: []string{`aliasbomb/bomb.yaml: invalid YAML: document 1: document expands to too many nodes`},
		is:   errTooComplex,
	},
	{
		name: "a path that does not exist",
		path: "nonexistent",
		want: []string{`nonexistent: overlay directory: file does not exist`},
		is:   fs.ErrNotExist,
	},
}

func TestBuildBrokenOverlays(t *testing.T) {
	noNetwork(t)
	for _, tc := range brokenOverlays {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := build(t, bad, tc.path)
			if err == nil {
				t.Fatalf("no error, rendered %d objects", len(objs))
			}
			if objs != nil {
				t.Errorf("objects returned with the error: %v", objs)
			}
			got := renderErrors(err)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(got), len(tc.want), err)
			}
			for i, want := range tc.want {
				if msg := got[i].Error(); !strings.HasPrefix(msg, want) {
					t.Errorf("error %d:\n got %s\nwant %s...", i, msg, want)
				}
				if got[i].File == "" {
					t.Errorf("error %d names no file: %v", i, got[i])
				}
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("errors.Is(err, %v) = false for %v", tc.is, err)
			}
		})
	}
}

// noNetwork fails the test if anything uses the default HTTP transport,
// which is what kustomize fetches remote files with, and empties PATH so
// that kustomize could not run git (or a plugin) if it tried.
func noNetwork(t *testing.T) {
	t.Helper()
	var calls atomic.Int32
	orig := http.DefaultTransport
	http.DefaultTransport = roundTripper(func(r *http.Request) (*http.Response, error) {
		calls.Add(1)
		return nil, errors.New("network access in a render test")
	})
	t.Setenv("PATH", t.TempDir())
	t.Cleanup(func() {
		http.DefaultTransport = orig
		if n := calls.Load(); n > 0 {
			t.Errorf("render made %d HTTP requests", n)
		}
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestBuildErrorIsUsableWithErrorsAs(t *testing.T) {
	_, err := build(t, bad, "duplicate")
	var re *Error
	if !errors.As(err, &re) {
		t.Fatalf("errors.As(*Error) failed for %v", err)
	}
	if re.File != "duplicate/b.yaml" || re.Object != "ConfigMap/default/twice" {
		t.Errorf("got File %q Object %q", re.File, re.Object)
	}
}

func TestBuildRefusesPathsOutsideTheArtifact(t *testing.T) {
	for _, p := range []string{"../testdata", "clusters/../../x", "/clusters/mgmt", "..", "clusters/mgmt/cluster.yaml"} {
		t.Run(p, func(t *testing.T) {
			if _, err := build(t, repo, p); err == nil || !strings.Contains(err.Error(), "path") {
				t.Errorf("Build(%q) = %v, want a path error", p, err)
			}
		})
	}
}

func TestBuildDoesNotRunPlugins(t *testing.T) {
	noNetwork(t)
	marker := filepath.Join(os.TempDir(), "capstan-render-plugin-ran")
	os.Remove(marker)
	if _, err := build(t, bad, "plugin"); !errors.Is(err, ErrPlugin) {
		t.Fatalf("got %v, want ErrPlugin", err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the exec plugin ran")
	}
}

func TestBuildLimits(t *testing.T) {
	small := fstest.MapFS{
		"kustomization.yaml": {Data: []byte("resources: [cm.yaml]\n")},
		"cm.yaml":            {Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n")},
	}
	for _, tc := range []struct {
		name string
		fsys fs.FS
		opts func(*Options)
		want string
	}{
		{"too many files", small, func(o *Options) { o.MaxFiles = 1 }, "artifact has more than 1 files"},
		// Build no longer copies the artifact: the bound is on what it reads.
		{"too many bytes", small, func(o *Options) { o.MaxBytes = 30 }, "cm.yaml: reading it brings what the build reads past --max-render-bytes=30B"},
		{"too many objects", repo, func(o *Options) { o.Path = "clusters/mgmt"; o.MaxObjects = 3 }, "build would produce up to 5 objects, more than 3"},
		{"a base used exponentially often", diamonds(20), func(o *Options) { o.Path = "l0" }, "more than 10000"},
		{"a large file used by a generator many times", generatorBomb(200, 1<<16), func(o *Options) { o.MaxBytes = 1 << 20 }, "build could produce"},
		{"a large annotation copied into many objects", annotationBomb(5000, 1<<15), nil, "build could produce"},
		{"a large targeted patch from a component", componentPatchBomb(5000, 1<<15), nil, "build could produce"},
		{"negative limit", small, func(o *Options) { o.MaxFiles = -1 }, "limits must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := DefaultOptions()
			if tc.opts != nil {
				tc.opts(&opts)
			}
			_, err := Build(context.Background(), tc.fsys, opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			if tc.name != "negative limit" && !errors.Is(err, ErrLimit) {
				t.Errorf("errors.Is(err, ErrLimit) = false for %v", err)
			}
		})
	}
}

// diamonds builds n levels of kustomizations where each level uses the next
// one twice (once with a name prefix), so level 0 renders 2^n objects.
func diamonds(n int) fstest.MapFS {
	m := fstest.MapFS{}
	for i := 0; i < n; i++ {
		m[fmt.Sprintf("l%d/kustomization.yaml", i)] = &fstest.MapFile{Data: []byte(fmt.Sprintf("resources: [../l%d, ../l%dp]\n", i+1, i+1))}
		m[fmt.Sprintf("l%dp/kustomization.yaml", i)] = &fstest.MapFile{Data: []byte(fmt.Sprintf("namePrefix: p%d-\nresources: [../l%d]\n", i, i))}
	}
	m[fmt.Sprintf("l%d/kustomization.yaml", n)] = &fstest.MapFile{Data: []byte("resources: [cm.yaml]\n")}
	m[fmt.Sprintf("l%dp/kustomization.yaml", n)] = &fstest.MapFile{Data: []byte("namePrefix: p-\nresources: [../l" + fmt.Sprint(n) + "]\n")}
	m[fmt.Sprintf("l%d/cm.yaml", n)] = &fstest.MapFile{Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n")}
	return m
}

// generatorBomb lists one file of size bytes n times in a ConfigMap
// generator.
func generatorBomb(n, size int) fstest.MapFS {
	var k strings.Builder
	k.WriteString("configMapGenerator:\n- name: big\n  files:\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&k, "  - k%d=big.txt\n", i)
	}
	return fstest.MapFS{
		"kustomization.yaml": {Data: []byte(k.String())},
		"big.txt":            {Data: bytes.Repeat([]byte("x"), size)},
	}
}

// annotationBomb makes n objects and gives each a commonAnnotation of size
// bytes.
func annotationBomb(n, size int) fstest.MapFS {
	var objs strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&objs, "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c%d}\n", i)
	}
	return fstest.MapFS{
		"kustomization.yaml": {Data: []byte("resources: [cms.yaml]\ncommonAnnotations:\n  big: " + strings.Repeat("x", size) + "\n")},
		"cms.yaml":           {Data: []byte(objs.String())},
	}
}

// componentPatchBomb makes n objects and patches all of them with a patch
// of size bytes that comes from a component without objects of its own.
func componentPatchBomb(n, size int) fstest.MapFS {
	m := annotationBomb(n, 0)
	m["kustomization.yaml"] = &fstest.MapFile{Data: []byte("resources: [cms.yaml]\ncomponents: [comp]\n")}
	m["comp/kustomization.yaml"] = &fstest.MapFile{Data: []byte("apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\npatches:\n- path: big.yaml\n  target: {kind: ConfigMap}\n")}
	m["comp/big.yaml"] = &fstest.MapFile{Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: any}\ndata:\n  big: " + strings.Repeat("x", size) + "\n")}
	return m
}

func TestBuildHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Build(ctx, repo, DefaultOptions()); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

func TestBuildIsSafeForConcurrentUse(t *testing.T) {
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			opts := DefaultOptions()
			opts.Path = "clusters/mgmt"
			objs, err := Build(context.Background(), repo, opts)
			if err == nil && len(objs) != 5 {
				err = fmt.Errorf("got %d objects", len(objs))
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// panickingFS makes kustomize panic while it reads files.
type panickingFS struct{ filesys.FileSystem }

func (panickingFS) ReadFile(string) ([]byte, error) { panic("boom") }

func TestRunKustomizeRecoversFromPanics(t *testing.T) {
	fsys := filesys.MakeFsInMemory()
	if err := fsys.WriteFile("/kustomization.yaml", []byte("resources: []\n")); err != nil {
		t.Fatal(err)
	}
	_, err := runKustomize(panickingFS{fsys}, ".", false)
	if err == nil || !strings.Contains(err.Error(), "kustomize panicked: boom") {
		t.Fatalf("got %v, want the panic as an error", err)
	}
}

func TestBuildKeepsOriginAnnotationsOnlyWhenAskedFor(t *testing.T) {
	fsys := fstest.MapFS{
		"kustomization.yaml": {Data: []byte("resources: [cm.yaml]\nbuildMetadata: [originAnnotations]\n")},
		"cm.yaml":            {Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n")},
	}
	objs, err := Build(context.Background(), fsys, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	if got := objs[0].GetAnnotations()["config.kubernetes.io/origin"]; !strings.Contains(got, "path: cm.yaml") {
		t.Errorf("origin annotation = %q, want it kept", got)
	}
	objs, err = build(t, repo, "clusters/mgmt")
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range objs {
		if len(obj.GetAnnotations()) > 0 {
			t.Errorf("%s has annotations %v", objectNameOf(obj), obj.GetAnnotations())
		}
	}
}

func TestBuildReportsUnsupportedFileNames(t *testing.T) {
	fsys := fstest.MapFS{
		"kustomization.yaml":  {Data: []byte("resources: [\"my config.yaml\"]\n")},
		"my config.yaml":      {Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n")},
		"unused file (1).txt": {Data: []byte("ignored unless referenced")},
	}
	_, err := Build(context.Background(), fsys, DefaultOptions())
	if err == nil || !strings.Contains(err.Error(), `resources[0]: "my config.yaml": file name not supported`) {
		t.Fatalf("got %v", err)
	}
}
