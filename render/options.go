package render

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strings"
)

// Defaults for the limits in Options.
const (
	// DefaultMaxFiles is the default for Options.MaxFiles.
	DefaultMaxFiles = 10000
	// DefaultMaxBytes is the default for Options.MaxBytes. kustomize
	// takes about 13 times its input in memory (docs/limits.md), so this
	// bounds one build to about 200 MiB.
	DefaultMaxBytes int64 = 16 << 20
	// DefaultMaxFileBytes is the default for Options.MaxFileBytes.
	DefaultMaxFileBytes int64 = 8 << 20
	// DefaultMaxObjects is the default for Options.MaxObjects.
	DefaultMaxObjects = 10000
)

// Options for Build.
type Options struct {
	// Path is the overlay directory inside the artifact, relative to its
	// root, e.g. "./clusters/mgmt". It must stay inside the root.
	Path string
	// Substitute holds the values for post-build ${VAR} substitution. A nil
	// map turns substitution off entirely, so that "${...}" in e.g. shell
	// scripts inside ConfigMaps is left alone; a non-nil (even empty) map
	// turns it on, which also applies ${VAR:=default} defaults.
	Substitute map[string]string
	// Substitution is strict: a ${VAR} without a default whose VAR is
	// not in Substitute is an error naming the variable, file, object and
	// field (${VAR:=default} and ${VAR:-} give intended defaults).
	// StrictSubstitute turns substitution on even when Substitute is nil,
	// as if it were empty.
	StrictSubstitute bool
	// MaxFiles is how many regular files the artifact may hold; only
	// their names and sizes are read for this. Zero means DefaultMaxFiles.
	MaxFiles int
	// MaxFileBytes bounds each file the build reads. Files no
	// kustomization reaches are never read and may be larger. Zero means
	// DefaultMaxFileBytes. `capstan run --max-file-bytes` sets it.
	MaxFileBytes int64
	// MaxBytes bounds what the build reads, each file counted once, and
	// also its estimated input, where a file counts each time a
	// kustomization uses it: this is what bounds kustomize's memory. Zero
	// means DefaultMaxBytes. `capstan run --max-render-bytes` sets it.
	MaxBytes int64
	// MaxObjects is how many objects the build may produce, estimated from
	// the kustomizations before kustomize runs and checked after. Zero means
	// DefaultMaxObjects.
	MaxObjects int
	// Decrypt turns sops decryption on: every file the build reads that
	// sops encrypted (YAML or JSON objects, a generator's dotenv or binary
	// file) is decrypted in memory with these keys as it is read, before
	// kustomize and substitution see it, and the objects from it carry
	// DecryptedAnnotation. A file that cannot be decrypted fails the build
	// (a *DecryptError per file, all of them together), so ciphertext is
	// never applied. nil leaves files as they are, for `capstan render`
	// without a key; a non-nil Keys without keys fails on any encrypted
	// file, for a daemon given none.
	Decrypt *Keys
}

// DefaultOptions returns Options for the artifact root with the default
// limits and substitution off.
func DefaultOptions() Options {
	return Options{
		Path:         ".",
		MaxFiles:     DefaultMaxFiles,
		MaxFileBytes: DefaultMaxFileBytes,
		MaxBytes:     DefaultMaxBytes,
		MaxObjects:   DefaultMaxObjects,
	}
}

// varName is what a substitution variable must look like; other names could
// never be referenced as ${NAME}.
var varName = regexp.MustCompile(`^[_[:alpha:]][_[:alpha:][:digit:]]*$`)

// normalize fills in defaults and reports every invalid option.
func (o Options) normalize() (Options, error) {
	var errs []error
	p, err := cleanRelPath(o.Path)
	if err != nil {
		errs = append(errs, fmt.Errorf("path %q: %w", o.Path, err))
	}
	o.Path = p
	if o.MaxFiles == 0 {
		o.MaxFiles = DefaultMaxFiles
	}
	if o.MaxFileBytes == 0 {
		o.MaxFileBytes = DefaultMaxFileBytes
	}
	if o.MaxBytes == 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxObjects == 0 {
		o.MaxObjects = DefaultMaxObjects
	}
	if o.MaxFiles < 0 || o.MaxFileBytes < 0 || o.MaxBytes < 0 || o.MaxObjects < 0 {
		errs = append(errs, errors.New("limits must not be negative"))
	}
	names := make([]string, 0, len(o.Substitute))
	for name := range o.Substitute {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !varName.MatchString(name) {
			errs = append(errs, fmt.Errorf("substitute: variable name %q must match %s", name, varName))
		}
	}
	return o, errors.Join(errs...)
}

// substitutes says whether post-build substitution runs.
func (o Options) substitutes() bool {
	return o.Substitute != nil || o.StrictSubstitute
}

var errEscapesRoot = errors.New("leaves the artifact root")

// cleanRelPath cleans a path that must be relative to the artifact root and
// stay inside it. "" and "./" mean the root, ".".
func cleanRelPath(p string) (string, error) {
	if p == "" {
		return ".", nil
	}
	if path.IsAbs(p) {
		return "", errors.New("must be relative to the artifact root")
	}
	c := path.Clean(p)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", errEscapesRoot
	}
	return c, nil
}
