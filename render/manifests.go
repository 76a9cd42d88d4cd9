package render

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// LoadManifests reads every *.yaml and *.yml file below dir in fsys as
// plain multi-document YAML (no kustomize) and returns the objects whose
// apiVersion and kind keep accepts, in file order (lexical) and document
// order. A nil keep accepts everything. A file larger than
// DefaultMaxFileBytes is an *Error, never read whole. The daemon uses it
// to discover the ClusterDeployments committed under a root path.
//
// kustomization.yaml and kustomization.yml files are skipped, and so are
// hidden files and directories (".github"). Documents that keep rejects are
// skipped without further checks, so other YAML (kustomize patches, helm
// values) may live in the same tree; keep sees "" for a missing apiVersion
// or kind. A YAML syntax error, a kept document without apiVersion, kind or
// metadata.name, or a kept object defined twice is an *Error naming the
// file and the document (1-based). All of them are joined; the objects that
// loaded fine are returned alongside, so the caller can choose between all
// or nothing and best effort.
func LoadManifests(fsys fs.FS, dir string, keep func(apiVersion, kind string) bool) ([]*unstructured.Unstructured, error) {
	root, err := cleanRelPath(dir)
	if err != nil {
		return nil, fmt.Errorf("load manifests from %q: %w", dir, err)
	}
	var (
		objs []*unstructured.Unstructured
		errs []error
		seen = map[string]string{}
	)
	walkErr := fs.WalkDir(fsys, root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			errs = append(errs, &Error{File: p, Err: err})
			if p == root {
				return fs.SkipAll
			}
			return nil
		}
		if p != root && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.IsDir() || !d.Type().IsRegular() || !isManifestFile(p) {
			return nil
		}
		if info, err := d.Info(); err == nil && info.Size() > DefaultMaxFileBytes {
			errs = append(errs, &Error{File: p, Err: manifestLimitError(info.Size())})
			return nil
		}
		data, err := readAtMost(fsys, p, DefaultMaxFileBytes)
		if errors.Is(err, errTooLong) {
			errs = append(errs, &Error{File: p, Err: manifestLimitError(int64(len(data)))})
			return nil
		}
		if err != nil {
			errs = append(errs, &Error{File: p, Err: err})
			return nil
		}
		docs, err := decodeDocuments(data)
		if err != nil {
			errs = append(errs, &Error{File: p, Err: fmt.Errorf("invalid YAML: %w", err)})
		}
		for _, doc := range docs {
			if doc.Value == nil {
				continue
			}
			var id identity
			if m := doc.object(); m != nil {
				id = readIdentity(m)
			}
			if keep != nil && !keep(id.APIVersion, id.Kind) {
				continue
			}
			id, problems := checkIdentity(p, doc, false)
			if len(problems) > 0 {
				errs = append(errs, problems...)
				continue
			}
			where := fmt.Sprintf("%s (document %d)", p, doc.Index)
			if prev, dup := seen[id.key()]; dup {
				errs = append(errs, &Error{File: p, Object: id.String(), Err: fmt.Errorf("object defined twice, also in %s", prev)})
				continue
			}
			seen[id.key()] = where
			objs = append(objs, &unstructured.Unstructured{Object: doc.object()})
		}
		return nil
	})
	if walkErr != nil {
		errs = append(errs, walkErr)
	}
	return objs, errors.Join(errs...)
}

// manifestLimitError is the error of a manifest file over the size
// LoadManifests reads: a file of ClusterDeployments is a few KiB, so a
// larger one is a mistake, never read whole.
func manifestLimitError(size int64) error {
	return fmt.Errorf("%d bytes, more than %s, the most a manifest file may hold; split the file: %w", size, formatBytes(DefaultMaxFileBytes), ErrLimit)
}

// isManifestFile says whether LoadManifests reads a file.
func isManifestFile(p string) bool {
	switch path.Base(p) {
	case "kustomization.yaml", "kustomization.yml":
		return false
	}
	ext := path.Ext(p)
	return ext == ".yaml" || ext == ".yml"
}
