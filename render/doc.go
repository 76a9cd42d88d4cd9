// Package render turns the content of a source into Kubernetes objects.
//
// In Capstan's data flow it sits between sources and stages:
//
//	sources.Artifact (fs.FS) -> render.Build -> []*unstructured.Unstructured -> stages
//
// Build runs a kustomize overlay found at a path inside the artifact, the
// way Flux's kustomize-controller does, and then optionally substitutes
// ${VAR} placeholders. It only returns data: applying, pruning and status
// belong to the stages and the reconciler.
//
// Artifacts come from the network and are not trusted. Build therefore
// reads only the files the overlay's kustomizations reach, when they are
// first needed, each within a per-file limit and all within a limit on
// what one build reads (kustomize's memory grows with its input), checks
// every kustomization it reaches before kustomize runs (no URLs or git
// bases, no plugins other than kustomize's builtins, no helm, no cycles,
// files inside the kustomization's directory, objects with an identity),
// runs kustomize with load restrictions on and recovers from its panics. Whatever is wrong
// is reported at once as *Error values that name the file, the object and
// the field, joined with errors.Join, so that a user can fix a commit in
// one go. All of them are stalled errors: retrying without a new revision
// cannot help.
//
// LoadManifests is the plain-YAML counterpart the daemon uses to discover
// ClusterDeployments committed under a root path.
package render
