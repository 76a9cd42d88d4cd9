package render

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path"
	"slices"
	"strings"

	"sigs.k8s.io/kustomize/api/types"
)

// Sentinel errors wrapped by the *Error values of the check, for callers
// and tests that want to tell them apart.
var (
	// ErrRemote: a kustomization refers to something outside the artifact
	// (a URL or a git repository). render never fetches anything.
	ErrRemote = errors.New("remote resources are not supported; vendor them into the repository")
	// ErrPlugin: a generator, transformer or validator is not one of
	// kustomize's builtin plugins.
	ErrPlugin = errors.New("only kustomize's builtin plugins (apiVersion: builtin) are allowed; exec, Go and KRM function plugins are disabled")
	// ErrHelm: a kustomization inflates helm charts.
	ErrHelm = errors.New("helm chart inflation is not supported; render the chart into the repository")
)

var errOutsideRoot = errors.New("file is outside the kustomization's directory, which kustomize's load restrictions forbid; make its directory a kustomization and refer to that")

// plan is what the check learnt that the build needs to know.
type plan struct {
	// usesOpenAPI: some kustomization sets a custom OpenAPI schema, which
	// kustomize keeps in process-wide state that must be reset afterwards.
	usesOpenAPI bool
	// keepOrigins: the root kustomization asks for origin annotations
	// itself, so they stay in the output.
	keepOrigins bool
	// plain holds the resources of the root kustomization when it is
	// plain (isPlain): buildPlain can build it without kustomize.
	plain []string
}

// estimate is an upper bound of what a kustomization produces, counting
// each use of a base or file. Additions saturate.
type estimate struct {
	objects int
	bytes   int64
	// perObject is what may be copied into every object the kustomization
	// (or, for a component, its user) holds: the kustomization file itself
	// (commonAnnotations, inline patches), patches with a target selector,
	// transformer configs.
	perObject int64
}

func (e *estimate) add(o estimate) {
	e.objects = min(e.objects, math.MaxInt-o.objects) + o.objects
	e.bytes = addSat(e.bytes, o.bytes)
	e.perObject = addSat(e.perObject, o.perObject)
}

func addSat(a, b int64) int64 {
	return min(a, math.MaxInt64-b) + b
}

func mulSat(a int64, n int) int64 {
	if a != 0 && int64(n) > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * int64(n)
}

// checker walks the kustomizations reachable from the root before kustomize
// sees them. It collects every problem it can find, refuses anything that
// would make kustomize reach outside the artifact (URLs, git repositories,
// plugins, helm), and estimates the size of the build so that limits hold
// before kustomize allocates anything. Each kustomization and file is
// checked once per mode however often it is used.
type checker struct {
	ctx   context.Context
	a     *artifact
	root  string
	errs  []error
	kusts map[kustKey]estimate
	// files holds the resource files checked, parsed the YAML files that
	// fields like patches name.
	files  map[kustKey]*checkedFile
	parsed map[kustKey]bool
	// stack holds the directories being checked, to find cycles, which
	// kustomize itself would follow until the stack overflows.
	stack []string
	plan  plan
}

// kustKey identifies a directory or file checked in a mode: plugin mode is
// for generator, transformer and validator configs, whose content
// kustomize loads further files from.
type kustKey struct {
	path   string
	plugin bool
}

// check checks the kustomization kfile in root and everything it uses.
func check(ctx context.Context, a *artifact, root, kfile string, opts Options) (plan, error) {
	c := &checker{
		ctx:    ctx,
		a:      a,
		root:   root,
		kusts:  map[kustKey]estimate{},
		files:  map[kustKey]*checkedFile{},
		parsed: map[kustKey]bool{},
	}
	est := c.kustomization(root, false)
	if err := ctx.Err(); err != nil {
		return plan{}, err
	}
	file := a.display(kfile)
	if est.objects > opts.MaxObjects {
		c.fail(&Error{File: file, Err: fmt.Errorf("build would produce up to %d objects, more than %d (--max-objects): %w", est.objects, opts.MaxObjects, ErrLimit)})
	}
	if est.bytes > opts.MaxBytes {
		c.fail(&Error{File: file, Err: fmt.Errorf("build could produce %d bytes (counting files each time they are used, and kustomizations, targeted patches and transformers once per object they may apply to), more than %d (--max-render-bytes): %w", est.bytes, opts.MaxBytes, ErrLimit)})
	}
	return c.plan, errors.Join(c.errs...)
}

func (c *checker) fail(errs ...error) {
	c.errs = append(c.errs, errs...)
}

// kustomization checks the kustomization in dir and returns its estimate.
func (c *checker) kustomization(dir string, plugin bool) estimate {
	key := kustKey{dir, plugin}
	if est, ok := c.kusts[key]; ok {
		return est
	}
	if c.ctx.Err() != nil {
		return estimate{}
	}
	kfile, err := c.a.kustomizationFile(dir)
	if err != nil {
		c.fail(err)
	}
	if kfile == "" {
		c.kusts[key] = estimate{}
		return estimate{}
	}
	if i := slices.Index(c.stack, dir); i >= 0 {
		cycle := append(slices.Clone(c.stack[i:]), dir)
		c.fail(&Error{File: c.a.display(kfile), Err: fmt.Errorf("kustomization cycle: %s", strings.Join(cycle, " -> "))})
		return estimate{}
	}
	c.stack = append(c.stack, dir)
	defer func() { c.stack = c.stack[:len(c.stack)-1] }()

	var est estimate
	if k, raw, ok := c.parseKustomization(kfile); ok {
		if dir == c.root && !plugin {
			c.plan.keepOrigins = slices.Contains(k.BuildMetadata, types.OriginAnnotations)
			if isPlain(raw) {
				c.plan.plain = plainResources(raw)
			}
		}
		est = c.fields(dir, kfile, k, raw, plugin)
	}
	c.kusts[key] = est
	return est
}

// parseKustomization decodes a kustomization file the way kustomize does
// (JSON field names, case-insensitive, no unknown fields) after our own YAML
// decoder has bounded alias expansion.
func (c *checker) parseKustomization(kfile string) (*types.Kustomization, map[string]interface{}, bool) {
	file := c.a.display(kfile)
	data, err := c.a.read(kfile)
	if err != nil {
		c.fail(&Error{File: file, Err: err})
		return nil, nil, false
	}
	docs, err := decodeDocuments(data)
	if err != nil {
		c.fail(&Error{File: file, Err: fmt.Errorf("invalid YAML: %w", err)})
		return nil, nil, false
	}
	var m map[string]interface{}
	n := 0
	for _, d := range docs {
		if d.Value != nil {
			n++
			m = d.object()
		}
	}
	if n != 1 || m == nil {
		c.fail(&Error{File: file, Err: errors.New("a kustomization file must hold exactly one YAML mapping")})
		return nil, nil, false
	}
	j, err := json.Marshal(m)
	if err != nil {
		c.fail(&Error{File: file, Err: err})
		return nil, nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	k := &types.Kustomization{}
	if err := dec.Decode(k); err != nil {
		c.fail(&Error{File: file, Err: fmt.Errorf("invalid kustomization: %w", err)})
		return nil, nil, false
	}
	if err := k.CheckEmpty(); err != nil {
		c.fail(&Error{File: file, Err: errors.New("kustomization is empty")})
		return nil, nil, false
	}
	return k, m, true
}

// fields checks every field of a kustomization that names something to
// load, and everything it names.
func (c *checker) fields(dir, kfile string, k *types.Kustomization, raw map[string]interface{}, plugin bool) estimate {
	var est estimate
	file := c.a.display(kfile)
	at := func(field string, i int) string { return fmt.Sprintf("%s[%d]", field, i) }

	seen := newSeenSet()
	for _, list := range []struct {
		field   string
		entries []string
	}{{"resources", k.Resources}, {"bases", k.Bases}} {
		for i, e := range list.entries {
			base := c.resource(kfile, dir, at(list.field, i), e, plugin, seen)
			base.perObject = 0 // applies to the base's objects only, already counted
			est.add(base)
		}
	}
	for i, e := range k.Components {
		if p, ok := c.resolve(kfile, dir, at("components", i), e); ok {
			if !c.a.isDir(p) {
				c.fail(&Error{File: file, Field: at("components", i), Err: fmt.Errorf("%q: a component must be a directory", e)})
				continue
			}
			est.add(c.resource(kfile, dir, at("components", i), e, plugin, seen))
		}
	}
	for _, list := range []struct {
		field   string
		entries []string
	}{{"generators", k.Generators}, {"transformers", k.Transformers}, {"validators", k.Validators}} {
		for i, e := range list.entries {
			e := c.pluginEntry(kfile, dir, at(list.field, i), e)
			if list.field != "generators" {
				e.objects, e.perObject, e.bytes = 0, e.bytes, 0
			}
			est.add(e)
		}
	}

	for _, list := range []struct {
		field   string
		patches []types.Patch
	}{{"patches", k.Patches}, {"patchesJson6902", k.PatchesJson6902}} {
		for i, p := range list.patches {
			var size int64
			if p.Path != "" {
				size = c.localFile(kfile, dir, at(list.field, i)+".path", p.Path, true, plugin)
			}
			if p.Patch != "" {
				c.inlineYAML(kfile, at(list.field, i)+".patch", p.Patch, plugin)
			}
			if p.Target != nil {
				est.perObject = addSat(est.perObject, size)
			} else {
				est.bytes = addSat(est.bytes, size)
			}
		}
	}
	for i, p := range k.PatchesStrategicMerge {
		if _, inline := inlineDocs(string(p)); inline {
			c.inlineYAML(kfile, at("patchesStrategicMerge", i), string(p), plugin)
			continue
		}
		est.bytes = addSat(est.bytes, c.localFile(kfile, dir, at("patchesStrategicMerge", i), string(p), true, plugin))
	}

	for _, list := range []struct {
		field string
		args  []types.GeneratorArgs
		kind  string
	}{{"configMapGenerator", configMapArgs(k.ConfigMapGenerator), "ConfigMap"}, {"secretGenerator", secretArgs(k.SecretGenerator), "Secret"}} {
		for i, g := range list.args {
			est.objects++
			// A sops file a generator reads is decrypted as it is loaded;
			// its errors name the object it makes.
			object := objectName(list.kind, g.Namespace, g.Name)
			for _, f := range append(append([]string{g.EnvSource}, g.EnvSources...), g.FileSources...) {
				if _, p, found := strings.Cut(f, "="); found {
					f = p
				}
				if f != "" {
					c.a.fs.dec.source(path.Join(dir, f), object)
					c.a.fs.sops.generatorReads(dir, list.kind, g.Namespace, g.Name, path.Join(dir, f))
				}
			}
			for j, f := range g.FileSources {
				// "key=path" names the data key; the path follows "=".
				if _, p, found := strings.Cut(f, "="); found {
					f = p
				}
				est.bytes = addSat(est.bytes, c.localFile(kfile, dir, fmt.Sprintf("%s[%d].files[%d]", list.field, i, j), f, false, plugin))
			}
			for j, f := range g.EnvSources {
				est.bytes = addSat(est.bytes, c.localFile(kfile, dir, fmt.Sprintf("%s[%d].envs[%d]", list.field, i, j), f, false, plugin))
			}
			if g.EnvSource != "" {
				est.bytes = addSat(est.bytes, c.localFile(kfile, dir, fmt.Sprintf("%s[%d].env", list.field, i), g.EnvSource, false, plugin))
			}
		}
	}

	for i, p := range k.Crds {
		c.localFile(kfile, dir, at("crds", i), p, true, plugin)
	}
	for i, p := range k.Configurations {
		c.localFile(kfile, dir, at("configurations", i), p, true, plugin)
	}
	for i, r := range k.Replacements {
		if r.Path != "" {
			c.localFile(kfile, dir, at("replacements", i)+".path", r.Path, true, plugin)
		}
	}
	if len(k.OpenAPI) > 0 {
		c.plan.usesOpenAPI = true
		if p := k.OpenAPI["path"]; p != "" {
			c.localFile(kfile, dir, "openapi.path", p, true, plugin)
		}
	}
	if len(k.HelmCharts) > 0 || len(k.HelmChartInflationGenerator) > 0 || k.HelmGlobals != nil {
		c.fail(&Error{File: file, Field: "helmCharts", Err: ErrHelm})
	}
	if plugin {
		c.fail(pluginKustomizationProblems(file, k, raw)...)
	}
	est.perObject = addSat(est.perObject, c.a.files[kfile])
	est.bytes = addSat(est.bytes, mulSat(est.perObject, est.objects))
	return est
}

var errPluginKustomization = errors.New("not allowed in a kustomization used as generators, transformers or validators")

// pluginKustomizationProblems keeps a kustomization whose output are plugin
// configs from writing a URL into a field that a builtin plugin loads (a
// PatchTransformer's path, say): the fields that copy values around or
// point transformers at arbitrary fields are refused, and so is any string
// in the kustomization that looks remote. Patches are scanned where they
// are checked.
func pluginKustomizationProblems(file string, k *types.Kustomization, raw map[string]interface{}) []error {
	var errs []error
	refuse := func(field string, used bool) {
		if used {
			errs = append(errs, &Error{File: file, Field: field, Err: errPluginKustomization})
		}
	}
	refuse("configurations", len(k.Configurations) > 0)
	refuse("crds", len(k.Crds) > 0)
	refuse("replacements", len(k.Replacements) > 0)
	refuse("vars", len(k.Vars) > 0)
	refuse("configMapGenerator", len(k.ConfigMapGenerator) > 0)
	refuse("secretGenerator", len(k.SecretGenerator) > 0)
	for i, l := range k.Labels {
		refuse(fmt.Sprintf("labels[%d].fields", i), len(l.FieldSpecs) > 0)
	}
	return append(errs, remoteProblems(file, "", raw)...)
}

func configMapArgs(in []types.ConfigMapArgs) []types.GeneratorArgs {
	out := make([]types.GeneratorArgs, len(in))
	for i, a := range in {
		out[i] = a.GeneratorArgs
	}
	return out
}

func secretArgs(in []types.SecretArgs) []types.GeneratorArgs {
	out := make([]types.GeneratorArgs, len(in))
	for i, a := range in {
		out[i] = a.GeneratorArgs
	}
	return out
}
