package render

import (
	"path"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/resource"
)

// PlaintextAnnotation, set to PlaintextAllowed on a Secret, says that the
// Secret is committed in plaintext on purpose (a value that is not
// secret, a test fixture), so that `capstan validate` does not warn about
// it.
const PlaintextAnnotation = "capstan.dev/plaintext"

// PlaintextAllowed is the value of PlaintextAnnotation that opts out.
const PlaintextAllowed = "allowed"

// sopsSources notes, whether or not the build decrypts, which files it
// read sops had encrypted and which files each generator reads, so that
// Result can tell an object committed encrypted from one committed in
// plaintext even when validate runs without a key.
type sopsSources struct {
	// encrypted holds the files read that hold sops content (with or
	// without a metadata block).
	encrypted map[string]bool
	// generators maps a generator, by its kustomization's directory and
	// the object it makes, to the files it reads.
	generators map[generatorKey][]string
}

type generatorKey struct {
	dir, object string
}

func newSopsSources() *sopsSources {
	return &sopsSources{encrypted: map[string]bool{}, generators: map[generatorKey][]string{}}
}

// read notes the content of the file p as the build reads it, before
// any decryption.
func (s *sopsSources) read(p string, data []byte) {
	if detect(p, data) != formatPlain {
		s.encrypted[path.Clean(p)] = true
	}
}

// generatorReads notes that the generator of object, in the
// kustomization of dir, reads the file p.
func (s *sopsSources) generatorReads(dir, object, p string) {
	k := generatorKey{path.Clean(dir), object}
	s.generators[k] = append(s.generators[k], path.Clean(p))
}

// objects says, for each resource, whether it came from sops-encrypted
// files: its document's file, or every file its generator reads. A
// generated object is matched to its generator by the identity it was
// generated with (kustomize keeps it through renames and the hash
// suffix) and by the directory of the kustomization that configured it.
func (s *sopsSources) objects(resources []*resource.Resource, files []string) []bool {
	out := make([]bool, len(resources))
	for i, res := range resources {
		if i >= len(files) || files[i] == "" {
			continue
		}
		f := path.Clean(files[i])
		if s.encrypted[f] {
			out[i] = true
			continue
		}
		id := res.OrgId()
		dir := path.Dir(f)
		reads, ok := s.generators[generatorKey{dir, objectName(id.Kind, id.Namespace, id.Name)}]
		if name, hashed := withoutHashSuffix(id.Name); !ok && hashed {
			reads = s.generators[generatorKey{dir, objectName(id.Kind, id.Namespace, name)}]
		}
		out[i] = len(reads) > 0
		for _, p := range reads {
			if !s.encrypted[p] {
				out[i] = false
			}
		}
	}
	return out
}

// withoutHashSuffix cuts the "-" and ten characters kustomize appends to
// a generated object's name (its original identity keeps them).
func withoutHashSuffix(name string) (string, bool) {
	const n = 10
	i := len(name) - n - 1
	if i <= 0 || name[i] != '-' {
		return name, false
	}
	for _, c := range name[i+1:] {
		if !strings.ContainsRune("bcdfghkmt2456789", c) {
			return name, false
		}
	}
	return name[:i], true
}

// FromEncrypted reports whether Objects[i] was rendered from files that
// are sops-encrypted in the artifact: its YAML or JSON document's file,
// or every env and file its generator reads. It holds whether or not the
// build decrypted them.
func (r *Result) FromEncrypted(i int) bool {
	return i >= 0 && i < len(r.encrypted) && r.encrypted[i]
}

// HoldsCiphertext reports whether obj came from sops-encrypted files that
// the build did not decrypt (Options.Decrypt was nil): its values are
// ciphertext and its document may still carry the sops metadata block, so
// a schema check or a dry run of it says nothing about what a daemon
// holding the key would apply.
func (r *Result) HoldsCiphertext(obj *unstructured.Unstructured) bool {
	return r.ciphertext[obj]
}

// noteEncrypted keeps which objects came from sops-encrypted files, and
// which of them hold ciphertext because the build did not decrypt.
func (r *Result) noteEncrypted(encrypted []bool, decrypted bool) {
	r.encrypted = encrypted
	if decrypted {
		return
	}
	for i, enc := range encrypted {
		if enc && i < len(r.Objects) {
			if r.ciphertext == nil {
				r.ciphertext = map[*unstructured.Unstructured]bool{}
			}
			r.ciphertext[r.Objects[i]] = true
		}
	}
}
