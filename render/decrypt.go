package render

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"

	"filippo.io/age"
	"github.com/ProtonMail/go-crypto/openpgp"
)

// Reasons of decryption failures: each names what the user must change.
// All are stalled (see Error.Failure): a new key or a new commit heals them,
// retrying does not.
const (
	// ReasonDecryptionKeyMissing: a file is encrypted, and the build was
	// given no key at all (no spec.decryption, no --decryption-key).
	ReasonDecryptionKeyMissing = "DecryptionKeyMissing"
	// ReasonDecryptionKeyMismatch: keys were given, but none of them is
	// among the file's recipients, or the one that is could not open it.
	ReasonDecryptionKeyMismatch = "DecryptionKeyMismatch"
	// ReasonDecryptionMACMismatch: the file was changed after sops
	// encrypted it (a value, its MAC or an unencrypted field).
	ReasonDecryptionMACMismatch = "DecryptionMACMismatch"
	// ReasonDecryptionMetadataMissing: the file holds sops-encrypted
	// values but no sops metadata block, so no key can open it.
	ReasonDecryptionMetadataMissing = "DecryptionMetadataMissing"
	// ReasonDecryptionUnsupportedKey: the file is encrypted only for key
	// types Capstan does not hold (cloud KMS, Vault), or a key file holds
	// a key that is neither an age X25519 identity nor an OpenPGP key.
	ReasonDecryptionUnsupportedKey = "DecryptionUnsupportedKey"
	// ReasonDecryptionFailed: the file is not a well-formed sops file, or
	// is used where decrypted content must not go.
	ReasonDecryptionFailed = "DecryptionFailed"
)

// DecryptedAnnotation marks an object that render decrypted from a sops
// file. Diffs and reports treat such an object as secret whatever its
// kind, so its values are never shown. It is the value of
// capstanv1.DecryptedAnnotation, spelled here because render imports only
// failure (docs/architecture.md, Imports); reconciler's tests check the two agree.
const DecryptedAnnotation = "capstan.dev/decrypted"

// Key file suffixes, in a decryption Secret and for --decryption-key.
const (
	// AgeKeySuffix ends the name of a file of age identities
	// (AGE-SECRET-KEY-1..., one a line, # comments allowed).
	AgeKeySuffix = ".agekey"
	// PGPKeySuffix ends the name of a file of ASCII-armored OpenPGP
	// private keys (without passphrase).
	PGPKeySuffix = ".asc"
)

// Keys are the private keys a build decrypts sops files with. They live in
// memory only: render never looks at the environment, a home directory or
// a gpg agent. The zero value holds no key: a build with it still finds
// every encrypted file and reports each as DecryptionKeyMissing instead of
// applying ciphertext.
type Keys struct {
	age []*age.X25519Identity
	pgp openpgp.EntityList
}

// KeyFileError is a key file that could not be used. Its message never
// quotes the file's content.
type KeyFileError struct {
	// File names the key file (a Secret's key or a path).
	File string
	// Reason is ReasonDecryptionUnsupportedKey or ReasonDecryptionFailed.
	Reason string
	// Err says what is wrong, without key material.
	Err error
}

// Error implements error.
func (e *KeyFileError) Error() string { return fmt.Sprintf("key file %s: %v", e.File, e.Err) }

// Unwrap returns the underlying problem.
func (e *KeyFileError) Unwrap() error { return e.Err }

// ParseKeys reads key files, keyed by name: names ending in AgeKeySuffix
// hold age identities, names ending in PGPKeySuffix armored OpenPGP private
// keys; other names are skipped, so that a Secret can carry notes. All
// problems are returned together, each a *KeyFileError.
func ParseKeys(files map[string][]byte) (*Keys, error) {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	k := &Keys{}
	var errs []error
	for _, name := range names {
		data := files[name]
		switch {
		case strings.HasSuffix(name, AgeKeySuffix):
			ids, err := parseAgeIdentities(data)
			if err != nil {
				errs = append(errs, &KeyFileError{File: name, Reason: ageKeyReason(err), Err: err})
				continue
			}
			k.age = append(k.age, ids...)
		case strings.HasSuffix(name, PGPKeySuffix):
			ents, err := openpgp.ReadArmoredKeyRing(bytes.NewReader(data))
			if err != nil {
				// go-crypto's messages describe packets, never key bytes.
				errs = append(errs, &KeyFileError{File: name, Reason: ReasonDecryptionFailed, Err: fmt.Errorf("not an ASCII-armored OpenPGP key ring: %w", err)})
				continue
			}
			for _, e := range ents {
				if e.PrivateKey == nil {
					errs = append(errs, &KeyFileError{File: name, Reason: ReasonDecryptionUnsupportedKey, Err: fmt.Errorf("key %X is a public key; export the private key (gpg --export-secret-keys --armor)", e.PrimaryKey.Fingerprint)})
					continue
				}
				if e.PrivateKey.Encrypted {
					errs = append(errs, &KeyFileError{File: name, Reason: ReasonDecryptionUnsupportedKey, Err: fmt.Errorf("key %X is protected by a passphrase, which a daemon cannot type; export it without one", e.PrimaryKey.Fingerprint)})
					continue
				}
				k.pgp = append(k.pgp, e)
			}
		}
	}
	return k, errors.Join(errs...)
}

var errUnsupportedAgeKey = errors.New("unsupported age key")

func ageKeyReason(err error) string {
	if errors.Is(err, errUnsupportedAgeKey) {
		return ReasonDecryptionUnsupportedKey
	}
	return ReasonDecryptionFailed
}

// parseAgeIdentities reads X25519 identities, one a line. age's own parser
// is not used for its errors, which may quote a line of the file.
func parseAgeIdentities(data []byte) ([]*age.X25519Identity, error) {
	var ids []*age.X25519Identity
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, err := age.ParseX25519Identity(line)
		if err != nil {
			if strings.HasPrefix(line, "AGE-PLUGIN-") || strings.HasPrefix(line, "-----BEGIN") || strings.HasPrefix(line, "ssh-") {
				return nil, fmt.Errorf("line %d: only age X25519 identities (AGE-SECRET-KEY-1...) are supported: %w", i+1, errUnsupportedAgeKey)
			}
			return nil, fmt.Errorf("line %d is not an age identity (AGE-SECRET-KEY-1...); make the file with age-keygen", i+1)
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return nil, errors.New("holds no age identity")
	}
	return ids, nil
}

// Len is how many keys k holds.
func (k *Keys) Len() int {
	if k == nil {
		return 0
	}
	return len(k.age) + len(k.pgp)
}

// Public names the keys k holds by what is public about them: age
// recipients and OpenPGP fingerprints, for messages.
func (k *Keys) Public() []string {
	if k == nil {
		return nil
	}
	var out []string
	for _, id := range k.age {
		out = append(out, id.Recipient().String())
	}
	for _, e := range k.pgp {
		out = append(out, fmt.Sprintf("%X", e.PrimaryKey.Fingerprint))
	}
	return out
}

// Merge returns keys holding the keys of k and of other.
func (k *Keys) Merge(other *Keys) *Keys {
	out := &Keys{}
	for _, x := range []*Keys{k, other} {
		if x != nil {
			out.age = append(out.age, x.age...)
			out.pgp = append(out.pgp, x.pgp...)
		}
	}
	return out
}

// hasAge reports whether k holds the identity of an age recipient.
func (k *Keys) hasAge(recipient string) bool {
	for _, id := range k.age {
		if id.Recipient().String() == recipient {
			return true
		}
	}
	return false
}

// hasPGP reports whether k holds the private key of a fingerprint (sops
// records the one the user named: the primary key's or a subkey's, long
// or short).
func (k *Keys) hasPGP(fingerprint string) bool {
	fp := strings.ToUpper(strings.ReplaceAll(fingerprint, " ", ""))
	if fp == "" {
		return false
	}
	for _, e := range k.pgp {
		if strings.HasSuffix(fmt.Sprintf("%X", e.PrimaryKey.Fingerprint), fp) {
			return true
		}
		for _, s := range e.Subkeys {
			if strings.HasSuffix(fmt.Sprintf("%X", s.PublicKey.Fingerprint), fp) {
				return true
			}
		}
	}
	return false
}

// DecryptError is a sops file that could not be decrypted. It names the
// recipients the file was encrypted for (age public keys, OpenPGP
// fingerprints), never key material or plaintext.
type DecryptError struct {
	// Reason is one of the ReasonDecryption* constants.
	Reason string
	// Recipients are the file's recipients, for DecryptionKeyMissing and
	// DecryptionKeyMismatch.
	Recipients []string
	// Err says what went wrong and what to do.
	Err error
}

// Error implements error.
func (e *DecryptError) Error() string {
	msg := e.Err.Error()
	if len(e.Recipients) > 0 {
		msg += " (encrypted for " + strings.Join(e.Recipients, ", ") + ")"
	}
	return msg
}

// Unwrap returns the underlying problem.
func (e *DecryptError) Unwrap() error { return e.Err }

// decryptor decrypts the sops files one build reads, each once, and keeps
// what it found for Build: the files it decrypted and every failure.
type decryptor struct {
	keys *Keys
	// sources maps a file a generator reads to the object it makes
	// ("Secret/name", "ConfigMap/name"), filled in by the check.
	sources map[string]string
	// decrypted holds the files that were decrypted.
	decrypted map[string]bool
	// errs are the failures, each an *Error for its file.
	errs []error
}

func newDecryptor(keys *Keys) *decryptor {
	if keys == nil {
		return nil
	}
	return &decryptor{keys: keys, sources: map[string]string{}, decrypted: map[string]bool{}}
}

// source records that a generator making object reads the file p.
func (d *decryptor) source(p, object string) {
	if d != nil {
		d.sources[p] = object
	}
}

// file returns the content of the file p decrypted if sops encrypted it,
// else as it is. A failure is recorded and the ciphertext returned, so
// that the build goes on and every other problem is found in the same
// run; Build then fails with all of them.
func (d *decryptor) file(p string, data []byte) []byte {
	if d == nil {
		return data
	}
	f := detect(p, data)
	if f == formatPlain {
		return data
	}
	object := d.sources[p]
	generated := object != ""
	if object == "" && f != formatDotenv && f != formatBinary {
		object = documentObjects(data)
	}
	if f == formatNoMetadata {
		d.fail(p, object, &DecryptError{Reason: ReasonDecryptionMetadataMissing, Err: errors.New("holds sops-encrypted values (ENC[...]) but no sops metadata block; encrypt the whole file again with sops")})
		return data
	}
	// A ConfigMap document sops encrypted is decrypted like any other
	// document (and marked); only a generator would spread the values of
	// a file into a ConfigMap nothing handles as secret.
	if generated && strings.HasPrefix(object, "ConfigMap/") {
		d.fail(p, object, &DecryptError{Reason: ReasonDecryptionFailed, Err: errors.New("a configMapGenerator reads this sops-encrypted file; use a secretGenerator, so that the values are handled as secrets")})
		return data
	}
	plain, err := decryptSops(f, data, d.keys)
	if err != nil {
		d.fail(p, object, err)
		return data
	}
	d.decrypted[p] = true
	return plain
}

func (d *decryptor) fail(p, object string, err error) {
	d.errs = append(d.errs, &Error{File: p, Object: object, Err: err})
}

// err joins the failures, or is nil.
func (d *decryptor) err() error {
	if d == nil {
		return nil
	}
	return errors.Join(d.errs...)
}

// documentObjects names the objects of an encrypted YAML or JSON file by
// their unencrypted identity, or "" when it has none to read.
func documentObjects(data []byte) string {
	docs, err := decodeDocuments(data)
	if err != nil {
		return ""
	}
	var names []string
	for _, doc := range docs {
		if doc.Value == nil {
			continue
		}
		id := readIdentity(doc.object())
		if id.Kind == "" || id.Name == "" || strings.HasPrefix(id.Kind, "ENC[") || strings.HasPrefix(id.Name, "ENC[") {
			names = append(names, documentName(doc.Index))
			continue
		}
		names = append(names, objectName(id.Kind, id.Namespace, id.Name))
	}
	return strings.Join(names, ", ")
}

// annotateDecrypted marks the objects that came from a decrypted file:
// a YAML or JSON document's, or one a generator read (sources says which
// generator made which object), so that a generated Secret gets every
// redaction a decrypted document gets.
func (d *decryptor) annotateDecrypted(res *Result, sources *sopsSources) {
	if d == nil || len(d.decrypted) == 0 {
		return
	}
	for i, obj := range res.Objects {
		if i >= len(res.Files) || res.Files[i] == "" {
			continue
		}
		f := path.Clean(res.Files[i])
		if d.decrypted[f] || sources.generatedDecrypted(f, obj.GetKind(), obj.GetName(), d.decrypted) {
			ann := obj.GetAnnotations()
			if ann == nil {
				ann = map[string]string{}
			}
			ann[DecryptedAnnotation] = "true"
			obj.SetAnnotations(ann)
		}
	}
}

// IsDecrypted reports whether render decrypted the object from a sops
// file, so that it must be handled as a secret whatever its kind.
func IsDecrypted(annotations map[string]string) bool {
	return annotations[DecryptedAnnotation] == "true"
}

// DecryptFile returns the plaintext of the sops file p as a build reads
// it, for tools and tests that must rewrite an encrypted file (decrypt,
// edit, encrypt again, as `sops edit` does); content that sops did not
// encrypt is returned as it is. Its errors are *DecryptError.
func DecryptFile(p string, data []byte, keys *Keys) ([]byte, error) {
	switch f := detect(p, data); f {
	case formatPlain:
		return data, nil
	case formatNoMetadata:
		return nil, &DecryptError{Reason: ReasonDecryptionMetadataMissing, Err: errors.New("holds sops-encrypted values (ENC[...]) but no sops metadata block")}
	default:
		if keys == nil {
			keys = &Keys{}
		}
		return decryptSops(f, data, keys)
	}
}
