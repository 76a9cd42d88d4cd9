package render

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"

	"sigs.k8s.io/kustomize/api/konfig"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"
)

// artifact is the view of an artifact that kustomize builds from: an index
// of its directories and files, taken from directory listings alone, and
// the content of the files the build reads, loaded when it first reads
// them (see lazyFS). Files no kustomization reaches are never read, so
// unrelated content in a repository costs neither memory nor a limit.
// Paths are slash-separated and relative to the root; in fs they are the
// same paths with a leading "/".
type artifact struct {
	fs *lazyFS
	// files maps each regular file to its size: the size the listing
	// reported until the file is loaded, then the bytes actually read.
	files map[string]int64
	// dirs holds every directory, "." included.
	dirs map[string]bool
	// unsupported maps files and directories that the in-memory filesystem
	// refused (it only takes names of a restricted character set) to why.
	unsupported map[string]error
	// unsupportedDirs holds the directories among unsupported.
	unsupportedDirs map[string]bool
	// generated holds the kustomization files render wrote itself.
	generated map[string]bool
}

var errUnsupportedName = errors.New("file name not supported by kustomize's in-memory filesystem; rename it")

// indexArtifact lists the directories and regular files of fsys, failing
// once there are more than opts.MaxFiles files, and returns an artifact
// that loads their content on first use, within opts' per-file and total
// limits. Symlinks and other irregular files are left out.
func indexArtifact(ctx context.Context, fsys fs.FS, opts Options) (*artifact, error) {
	a := &artifact{
		files:           map[string]int64{},
		dirs:            map[string]bool{".": true},
		unsupported:     map[string]error{},
		unsupportedDirs: map[string]bool{},
		generated:       map[string]bool{},
	}
	a.fs = newLazyFS(fsys, a, opts)
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return &Error{File: p, Err: fmt.Errorf("read artifact: %w", err)}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p == "." {
			return nil
		}
		if d.IsDir() {
			if err := a.fs.inner.MkdirAll("/" + p); err != nil {
				a.unsupported[p] = fmt.Errorf("%w (%v)", errUnsupportedName, err)
				a.unsupportedDirs[p] = true
				return fs.SkipDir
			}
			a.dirs[p] = true
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if len(a.files) >= opts.MaxFiles {
			return &Error{File: p, Err: fmt.Errorf("artifact has more than %d files: %w", opts.MaxFiles, ErrLimit)}
		}
		var size int64
		if info, err := d.Info(); err == nil {
			size = info.Size()
		}
		// An empty placeholder, so that kustomize's listings, globs and
		// existence checks see the file; lazyFS fills it on first read.
		if err := a.fs.inner.WriteFile("/"+p, nil); err != nil {
			a.unsupported[p] = fmt.Errorf("%w (%v)", errUnsupportedName, err)
			return nil
		}
		a.files[p] = size
		return nil
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}

func (a *artifact) isDir(p string) bool  { return a.dirs[p] }
func (a *artifact) isFile(p string) bool { _, ok := a.files[p]; return ok }

// read returns the content of the file p, loading it first if need be. A
// limit it breaks is an error wrapping ErrLimit that does not name p: the
// caller puts it in an *Error for p.
func (a *artifact) read(p string) ([]byte, error) {
	if err := a.fs.load(p); err != nil {
		return nil, err
	}
	return a.fs.inner.ReadFile("/" + p)
}

// write puts a file render made itself into the filesystem kustomize reads.
func (a *artifact) write(p string, data []byte) error {
	if err := a.fs.inner.WriteFile("/"+p, data); err != nil {
		return err
	}
	a.fs.loaded[p] = true
	a.files[p] = int64(len(data))
	return nil
}

// display is how errors name a file: generated ones say so, since the user
// cannot find them in the repository.
func (a *artifact) display(p string) string {
	if a.generated[p] {
		return p + " (generated)"
	}
	return p
}

// kustomizationFile returns the kustomization file of dir, or "" if it has
// none. More than one is an error, as it is for kustomize.
func (a *artifact) kustomizationFile(dir string) (string, error) {
	var found []string
	for _, name := range konfig.RecognizedKustomizationFileNames() {
		if p := path.Join(dir, name); a.isFile(p) {
			found = append(found, p)
		}
	}
	switch len(found) {
	case 0:
		return "", nil
	case 1:
		return found[0], nil
	}
	return "", &Error{File: dir, Err: fmt.Errorf("more than one kustomization file: %s", strings.Join(found, ", "))}
}

// filesBelow lists the files below dir (not in it only), sorted, together
// with the unsupported ones, so that a generated kustomization names them
// and the check reports them.
func (a *artifact) filesBelow(dir string) []string {
	var out []string
	add := func(p string) {
		if dir == "." || strings.HasPrefix(p, dir+"/") {
			out = append(out, p)
		}
	}
	for p := range a.files {
		add(p)
	}
	for p := range a.unsupported {
		add(p)
	}
	sort.Strings(out)
	return out
}

// requestOrigins adds originAnnotations to the buildMetadata of the root
// kustomization, so that objects can be traced back to their files.
func (a *artifact) requestOrigins(kfile string) error {
	data, err := a.read(kfile)
	if err != nil {
		return &Error{File: a.display(kfile), Err: err}
	}
	rn, err := kyaml.Parse(string(data))
	if err != nil {
		return &Error{File: a.display(kfile), Err: fmt.Errorf("invalid YAML: %w", err)}
	}
	seq, err := rn.Pipe(kyaml.LookupCreate(kyaml.SequenceNode, "buildMetadata"))
	if err != nil {
		return &Error{File: a.display(kfile), Field: "buildMetadata", Err: err}
	}
	for _, v := range seq.YNode().Content {
		if v.Value == types.OriginAnnotations {
			return nil
		}
	}
	seq.YNode().Content = append(seq.YNode().Content, kyaml.NewStringRNode(types.OriginAnnotations).YNode())
	out, err := rn.String()
	if err != nil {
		return &Error{File: a.display(kfile), Err: err}
	}
	return a.fs.inner.WriteFile("/"+kfile, []byte(out))
}

var _ filesys.FileSystem = (*lazyFS)(nil)
