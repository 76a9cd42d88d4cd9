package render

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resmap"
	"sigs.k8s.io/kustomize/api/resource"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/kustomize/kyaml/openapi"
)

// ErrLimit is wrapped by the errors Build returns when the artifact or the
// build exceeds one of the limits in Options.
var ErrLimit = errors.New("limit exceeded")

// kustomizeMu serialises kustomize runs. kustomize keeps its OpenAPI schema
// in process-wide state that a kustomization's "openapi" field replaces, and
// has had concurrent map access bugs (kubernetes-sigs/kustomize#3659).
var kustomizeMu sync.Mutex

// Build renders the kustomize overlay at opts.Path inside fsys and returns
// its objects in kustomize's order: the kustomization's sortOptions if it
// has them, else kustomize's legacy order (namespaces and CRDs first).
//
// Only the files the overlay's kustomizations reach are read from fsys,
// when the check or kustomize first needs them, each within
// opts.MaxFileBytes and all of them within opts.MaxBytes; the rest of fsys
// is only listed. kustomize runs on that view with plugins, helm and
// remote bases off and its load restrictions on, so a build reads nothing
// but fsys and never touches the network. Before kustomize runs, every kustomization reachable from the
// overlay is checked, and all problems found are returned together, each an
// *Error naming the file, object and field. Problems kustomize itself finds
// come back as one *Error naming the overlay's kustomization file.
//
// A directory without a kustomization file gets a generated one, as Flux
// does: it lists every *.yaml and *.yml file below the directory, except
// that a subdirectory with its own kustomization file is listed as a whole
// and not descended into. Hidden files and directories are left out.
//
// If opts enable it, ${VAR} placeholders are then substituted in each
// object that does not opt out with SubstituteAnnotation. Substitution
// works string by string on the object, so no value can change an object's
// structure; a string that is a single ${...} becomes an integer or a
// boolean when its value is one.
//
// kustomize cannot be interrupted, so ctx is checked between the steps; the
// limits bound how long the kustomize step itself can take.
//
// A ${VAR} without a default whose VAR is not set is an error (an
// *Error wrapping *UnsetVariableError); BuildResult returns the objects
// despite it, for a preflight that reports it beside every other problem.
func Build(ctx context.Context, fsys fs.FS, opts Options) ([]*unstructured.Unstructured, error) {
	res, err := BuildResult(ctx, fsys, opts)
	if err != nil {
		return nil, err
	}
	if err := res.UnsetErr(); err != nil {
		return nil, err
	}
	return res.Objects, nil
}

// Result is what BuildResult rendered.
type Result struct {
	// Objects are the rendered objects, in kustomize's order.
	Objects []*unstructured.Unstructured
	// Files holds the file each object came from, relative to the
	// artifact root, or "" when kustomize did not say.
	Files []string
	// Unset are the ${VAR}s without a default whose VAR is not set, each
	// naming file, object, field and variable. The strings that hold them
	// are left as written; the rest of their object is substituted.
	Unset []*Error
	// unsetIn are the objects that hold the Unset variables.
	unsetIn []*unstructured.Unstructured
	// encrypted says which objects came from sops-encrypted files (see
	// FromEncrypted).
	encrypted []bool
	// ciphertext holds those of them the build did not decrypt.
	ciphertext map[*unstructured.Unstructured]bool
}

// HasUnset reports whether obj holds one of the Unset variables.
func (r *Result) HasUnset(obj *unstructured.Unstructured) bool {
	for _, o := range r.unsetIn {
		if o == obj {
			return true
		}
	}
	return false
}

// UnsetErr joins the Unset problems, or returns nil when there are none.
func (r *Result) UnsetErr() error {
	errs := make([]error, len(r.Unset))
	for i, e := range r.Unset {
		errs[i] = e
	}
	return errors.Join(errs...)
}

// BuildResult is Build that also returns where each object came from,
// and that returns the objects when the only problems are unset
// variables (Result.Unset): every other problem is an error, as in Build.
func BuildResult(ctx context.Context, fsys fs.FS, opts Options) (*Result, error) {
	opts, err := opts.normalize()
	if err != nil {
		return nil, fmt.Errorf("render: invalid options: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	a, err := indexArtifact(ctx, fsys, opts)
	if err != nil {
		return nil, err
	}
	root := opts.Path
	if a.isFile(root) {
		return nil, &Error{File: root, Err: errors.New("is a file; the path must be a directory")}
	}
	if !a.isDir(root) {
		return nil, &Error{File: root, Err: fmt.Errorf("overlay directory: %w", fs.ErrNotExist)}
	}
	kfile, err := a.kustomizationFile(root)
	if err != nil {
		return nil, err
	}
	if kfile == "" {
		if kfile, err = a.generateKustomization(root); err != nil {
			return nil, err
		}
	}
	plan, err := check(ctx, a, root, kfile, opts)
	if err != nil {
		return nil, errors.Join(err, a.fs.dec.err())
	}
	if err := a.requestOrigins(kfile); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	resources, err := buildResources(a, root, kfile, plan)
	if derr := a.fs.dec.err(); derr != nil {
		// Whatever kustomize made of ciphertext is moot: say what to fix.
		return nil, derr
	}
	if err != nil {
		return nil, err
	}
	objs, files, err := toObjects(resources, root, plan.keepOrigins)
	if err != nil {
		return nil, &Error{File: a.display(kfile), Err: err}
	}
	if len(objs) > opts.MaxObjects {
		return nil, &Error{File: a.display(kfile), Err: fmt.Errorf("build produced %d objects, more than --max-objects=%d: %w", len(objs), opts.MaxObjects, ErrLimit)}
	}
	res := &Result{Objects: objs, Files: files}
	res.noteEncrypted(a.fs.sops.objects(resources, files), opts.Decrypt != nil)
	a.fs.dec.annotateDecrypted(res, a.fs.sops)
	if opts.substitutes() {
		unset, in, err := substituteAll(ctx, objs, files, opts)
		if err != nil {
			return nil, err
		}
		res.Unset, res.unsetIn = unset, in
	}
	return res, nil
}

// plainBuilds turns buildPlain on; a test turns it off to compare.
var plainBuilds = true

// buildResources runs kustomize on the overlay at root, or buildPlain when its
// kustomization is plain.
func buildResources(a *artifact, root, kfile string, plan plan) ([]*resource.Resource, error) {
	if plan.plain != nil && plainBuilds {
		if resources, ok := buildPlain(a, root, plan.plain); ok {
			return resources, nil
		}
	}
	m, err := runKustomize(a.fs, root, plan.usesOpenAPI)
	if err != nil {
		if a.fs.err != nil {
			// A file only kustomize reads (one a builtin plugin's config
			// names) broke a limit: say which, in render's words.
			return nil, a.fs.err
		}
		return nil, &Error{File: a.display(kfile), Err: fmt.Errorf("kustomize build: %w", err)}
	}
	return m.Resources(), nil
}

// runKustomize builds the kustomization in dir of fsys, turning a panic
// into an error.
func runKustomize(fsys filesys.FileSystem, dir string, resetOpenAPI bool) (m resmap.ResMap, err error) {
	kustomizeMu.Lock()
	defer kustomizeMu.Unlock()
	if resetOpenAPI {
		// A custom schema would otherwise stay in force for later builds.
		defer openapi.ResetOpenAPI()
	}
	defer func() {
		if r := recover(); r != nil {
			m, err = nil, fmt.Errorf("kustomize panicked: %v", r)
		}
	}()
	k := krusty.MakeKustomizer(&krusty.Options{
		Reorder:          krusty.ReorderOptionUnspecified,
		LoadRestrictions: types.LoadRestrictionsRootOnly,
		// Builtin plugins only, statically linked; helm stays off because
		// HelmConfig.Enabled is false.
		PluginConfig: types.DisabledPluginConfig(),
	})
	return k.Run(fsys, path.Join("/", dir))
}

// toObjects converts kustomize's output and works out each object's file
// from its origin annotation, which is then removed unless the overlay asked
// for it itself.
func toObjects(resources []*resource.Resource, root string, keepOrigins bool) ([]*unstructured.Unstructured, []string, error) {
	files := make([]string, len(resources))
	for i, res := range resources {
		origin, err := res.GetOrigin()
		if err != nil || origin == nil {
			continue
		}
		p := origin.Path
		if p == "" {
			p = origin.ConfiguredIn
		}
		if p != "" {
			files[i] = path.Join(root, p)
		}
	}
	objs := make([]*unstructured.Unstructured, 0, len(resources))
	for _, res := range resources {
		if !keepOrigins {
			if err := res.SetOrigin(nil); err != nil {
				return nil, nil, fmt.Errorf("remove origin annotations: %w", err)
			}
		}
		data, err := res.MarshalJSON()
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", res.CurId(), err)
		}
		obj := map[string]interface{}{}
		if err := utiljson.Unmarshal(data, &obj); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", res.CurId(), err)
		}
		objs = append(objs, &unstructured.Unstructured{Object: obj})
	}
	return objs, files, nil
}
