package render

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"path"
	"regexp"
	"sort"
	"strings"

	"sigs.k8s.io/kustomize/api/konfig"
)

// checkedFile is what the check learnt about a resource file.
type checkedFile struct {
	ids []checkedID
	est estimate
}

// checkedID is the identity of one document of a checked file.
type checkedID struct {
	id    identity
	index int
}

// errNotFound is fs.ErrNotExist with a message that reads well after a
// kustomization entry.
type errNotFound struct{}

func (errNotFound) Error() string        { return "no such file or directory in the artifact" }
func (errNotFound) Is(target error) bool { return target == fs.ErrNotExist }

// within says whether p is dir or below it.
func within(dir, p string) bool {
	return dir == "." || p == dir || strings.HasPrefix(p, dir+"/")
}

// resolve turns an entry of the kustomization kfile in dir into a path in
// the artifact, or reports why there is none.
func (c *checker) resolve(kfile, dir, field, entry string) (string, bool) {
	fail := func(err error) (string, bool) {
		c.fail(&Error{File: c.a.display(kfile), Field: field, Err: fmt.Errorf("%q: %w", entry, err)})
		return "", false
	}
	if isRemote(entry) {
		return fail(ErrRemote)
	}
	if entry == "" {
		return fail(errors.New("empty path"))
	}
	if path.IsAbs(entry) {
		return fail(errors.New("absolute paths are not allowed"))
	}
	p := path.Join(dir, entry)
	if p == ".." || strings.HasPrefix(p, "../") {
		return fail(errEscapesRoot)
	}
	if err, ok := c.a.unsupported[p]; ok {
		return fail(err)
	}
	if !c.a.isFile(p) && !c.a.isDir(p) {
		return fail(errNotFound{})
	}
	return p, true
}

// seenSet is what a kustomization's entries have used so far, to report
// an entry listed twice and an object defined in two of its files.
type seenSet struct {
	paths map[string]string
	ids   map[string]string
}

func newSeenSet() *seenSet {
	return &seenSet{paths: map[string]string{}, ids: map[string]string{}}
}

// resource checks an entry of resources, bases or components (or, in
// plugin mode, generators, transformers and validators): a YAML file in
// the kustomization's directory or a directory with a kustomization. seen
// may be nil.
func (c *checker) resource(kfile, dir, field, entry string, plugin bool, seen *seenSet) estimate {
	p, ok := c.resolve(kfile, dir, field, entry)
	if !ok {
		return estimate{}
	}
	if seen != nil {
		if prev, dup := seen.paths[p]; dup {
			c.fail(&Error{File: c.a.display(kfile), Field: field, Err: fmt.Errorf("%q is listed twice, also as %s", entry, prev)})
			return estimate{}
		}
		seen.paths[p] = field
	}
	if c.a.isDir(p) {
		if k, err := c.a.kustomizationFile(p); k == "" && err == nil {
			c.fail(&Error{File: c.a.display(kfile), Field: field, Err: fmt.Errorf("%q: directory has no kustomization file", entry)})
			return estimate{}
		}
		return c.kustomization(p, plugin)
	}
	if !within(dir, p) {
		c.fail(&Error{File: c.a.display(kfile), Field: field, Err: fmt.Errorf("%q: %w", entry, errOutsideRoot)})
		return estimate{}
	}
	cf := c.resourceFile(p, plugin)
	for _, d := range cf.ids {
		if seen == nil {
			break
		}
		if prev, dup := seen.ids[d.id.key()]; dup {
			c.fail(&Error{File: p, Object: d.id.String(), Err: fmt.Errorf("object defined twice, also in %s", prev)})
			continue
		}
		seen.ids[d.id.key()] = fmt.Sprintf("%s (document %d)", p, d.index)
	}
	return cf.est
}

// resourceFile checks a file of Kubernetes objects (or plugin configs),
// once per mode.
func (c *checker) resourceFile(p string, plugin bool) *checkedFile {
	key := kustKey{p, plugin}
	if cf, ok := c.files[key]; ok {
		return cf
	}
	cf := &checkedFile{est: estimate{bytes: c.a.files[p]}}
	c.files[key] = cf
	data, err := c.a.read(p)
	if err != nil {
		c.fail(&Error{File: p, Err: err})
		return cf
	}
	cf.est.bytes = c.a.files[p] // what was read, not what the listing said
	docs, err := decodeDocuments(data)
	if err != nil {
		c.fail(&Error{File: p, Err: fmt.Errorf("invalid YAML: %w", err)})
	}
	for _, d := range docs {
		if d.Value == nil {
			continue
		}
		id, errs := checkIdentity(p, d, true)
		c.fail(errs...)
		if len(errs) == 0 {
			cf.ids = append(cf.ids, checkedID{id: id, index: d.Index})
		}
		if plugin {
			c.fail(pluginProblems(p, d, id)...)
		}
		cf.est.objects += objectCount(d)
	}
	return cf
}

// objectCount is how many objects a document is: kustomize unpacks lists.
func objectCount(d document) int {
	if items, ok := d.object()["items"].([]interface{}); ok && strings.HasSuffix(readIdentity(d.object()).Kind, "List") {
		return len(items)
	}
	return 1
}

// pluginEntry checks an entry of generators, transformers or validators:
// either inline YAML holding plugin configs, or a file or directory of them.
func (c *checker) pluginEntry(kfile, dir, field, entry string) estimate {
	docs, inline := inlineDocs(entry)
	if !inline {
		return c.resource(kfile, dir, field, entry, true, nil)
	}
	var est estimate
	for _, d := range docs {
		if d.Value == nil {
			continue
		}
		id, errs := checkIdentity("", d, false)
		errs = append(errs, pluginProblems("", d, id)...)
		for _, err := range errs {
			c.fail(&Error{File: c.a.display(kfile), Field: field, Err: err})
		}
		est.objects++
	}
	return est
}

// inlineDocs says whether a kustomization entry is inline YAML rather than
// a path, the way kustomize decides it: it is if it parses as YAML with at
// least one mapping in it.
func inlineDocs(entry string) ([]document, bool) {
	docs, err := decodeDocuments([]byte(entry))
	if err != nil {
		return nil, false
	}
	for _, d := range docs {
		if d.object() != nil {
			return docs, true
		}
	}
	return nil, false
}

// localFile checks a file that a kustomization field names (a patch, a
// generator source, a CRD, ...) and returns its size. YAML files are parsed
// so that kustomize never sees an alias bomb, and in plugin mode scanned
// for anything remote.
func (c *checker) localFile(kfile, dir, field, entry string, isYAML, plugin bool) int64 {
	p, ok := c.resolve(kfile, dir, field, entry)
	if !ok {
		return 0
	}
	fail := func(err error) int64 {
		c.fail(&Error{File: c.a.display(kfile), Field: field, Err: fmt.Errorf("%q: %w", entry, err)})
		return 0
	}
	if c.a.isDir(p) {
		return fail(errors.New("is a directory, not a file"))
	}
	if !within(dir, p) {
		return fail(errOutsideRoot)
	}
	if !isYAML {
		return c.a.files[p]
	}
	key := kustKey{p, plugin}
	if c.parsed[key] {
		return c.a.files[p]
	}
	c.parsed[key] = true
	data, err := c.a.read(p)
	if err != nil {
		c.fail(&Error{File: p, Err: err})
		return 0
	}
	docs, err := decodeDocuments(data)
	if err != nil {
		c.fail(&Error{File: p, Err: fmt.Errorf("invalid YAML: %w", err)})
	}
	if plugin {
		for _, d := range docs {
			c.fail(remoteProblems(p, documentName(d.Index), d.Value)...)
		}
	}
	return c.a.files[p]
}

// inlineYAML checks YAML held in a string field of a kustomization, such as
// an inline patch.
func (c *checker) inlineYAML(kfile, field, s string, plugin bool) {
	docs, err := decodeDocuments([]byte(s))
	if err != nil {
		c.fail(&Error{File: c.a.display(kfile), Field: field, Err: fmt.Errorf("invalid YAML: %w", err)})
	}
	if plugin {
		for _, d := range docs {
			for _, err := range remoteProblems("", documentName(d.Index), d.Value) {
				c.fail(&Error{File: c.a.display(kfile), Field: field, Err: err})
			}
		}
	}
}

// pluginProblems reports why a plugin config may not be used: it is not a
// builtin plugin, it inflates helm charts, or it names something remote.
// Builtin plugins load the files their configs name (a patch path, a values
// file) through the same loader as kustomizations, so any string that looks
// remote is refused, wherever it is.
func pluginProblems(file string, d document, id identity) []error {
	var errs []error
	name := id.String()
	if id.Kind == "" || id.Name == "" {
		name = documentName(d.Index)
	}
	if id.APIVersion != konfig.BuiltinPluginApiVersion {
		errs = append(errs, &Error{File: file, Object: name, Field: "apiVersion", Err: ErrPlugin})
	} else if id.Kind == "HelmChartInflationGenerator" {
		errs = append(errs, &Error{File: file, Object: name, Err: ErrHelm})
	}
	return append(errs, remoteProblems(file, name, d.Value)...)
}

// remoteProblems reports every string in v that kustomize could take for a
// URL or a git repository.
func remoteProblems(file, object string, v interface{}) []error {
	var errs []error
	var path fieldPath
	var walk func(v interface{})
	walk = func(v interface{}) {
		switch v := v.(type) {
		case string:
			if looksRemote(v) {
				errs = append(errs, &Error{File: file, Object: object, Field: path.String(), Err: fmt.Errorf("%q: %w", v, ErrRemote)})
			}
		case map[string]interface{}:
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				path = append(path, k)
				walk(v[k])
				path = path[:len(path)-1]
			}
		case []interface{}:
			for i, item := range v {
				path = append(path, i)
				walk(item)
				path = path[:len(path)-1]
			}
		}
	}
	walk(v)
	return errs
}

// scpUser is the "user@" that makes kustomize read host:path as a git
// repository in scp syntax.
var scpUser = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9-]*@`)

// isRemote says whether kustomize would fetch a path entry over the
// network (HTTP or git) instead of reading it from the artifact. It follows
// kustomize's own tests (loader.IsRemoteFile, git.NewRepoSpecFromURL) but
// errs on the side of refusing: anything with a URL scheme counts, so a
// local file whose name has a colon before any slash is refused too.
func isRemote(s string) bool {
	if looksRemote(s) {
		return true
	}
	u, err := url.Parse(strings.TrimSpace(s))
	return err == nil && u.Scheme != ""
}

// looksRemote is isRemote for strings that are not known to be paths:
// narrower, so that a config value like "app:web" passes.
func looksRemote(s string) bool {
	l := strings.ToLower(strings.TrimSpace(s))
	switch {
	case strings.Contains(l, "://"),
		strings.HasPrefix(l, "git::"),
		strings.HasPrefix(l, "github.com/"), strings.HasPrefix(l, "github.com:"),
		strings.HasPrefix(l, "http:"), strings.HasPrefix(l, "https:"),
		scpUser.MatchString(l):
		return true
	}
	return false
}
