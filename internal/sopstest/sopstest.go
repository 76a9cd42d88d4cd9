// Package sopstest encrypts files the way `sops encrypt` does, with the
// sops library itself, for tests and for the examples' demo key (there is
// no sops binary to shell out to, and a test must not depend on one). It
// writes ciphertext only; decrypting is render's job, which this package
// must not import (internal/archtest).
package sopstest

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/ProtonMail/go-crypto/openpgp"
	pgparmor "github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/ProtonMail/go-crypto/openpgp/packet"
	"github.com/getsops/sops/v3"
	sopsaes "github.com/getsops/sops/v3/aes"
	sopsage "github.com/getsops/sops/v3/age"
	"github.com/getsops/sops/v3/config"
	"github.com/getsops/sops/v3/keys"
	sopspgp "github.com/getsops/sops/v3/pgp"
	sopsdotenv "github.com/getsops/sops/v3/stores/dotenv"
	sopsjson "github.com/getsops/sops/v3/stores/json"
	sopsyaml "github.com/getsops/sops/v3/stores/yaml"
)

// Format is the sops store a file is written with; sops picks it from the
// file's extension.
type Format int

const (
	// FormatYAML is a YAML file, one or more documents (.yaml).
	FormatYAML Format = iota
	// FormatJSON is a JSON document (.json).
	FormatJSON
	// FormatDotenv is a KEY=value file (.env).
	FormatDotenv
	// FormatBinary is any other file, wrapped as {"data": ..., "sops": ...}.
	FormatBinary
)

// sopsVersion is written into the metadata, as the sops release whose
// library does the encryption.
const sopsVersion = "3.13.3"

// SecretDataRegex encrypts the values of a Secret's data and stringData
// and leaves its identity readable, as `sops encrypt
// --encrypted-regex '^(data|stringData)$'` does (docs/secrets.md).
const SecretDataRegex = "^(data|stringData)$"

type store interface {
	LoadPlainFile(in []byte) (sops.TreeBranches, error)
	EmitEncryptedFile(sops.Tree) ([]byte, error)
}

func (f Format) store() store {
	switch f {
	case FormatJSON:
		return sopsjson.NewStore(&config.JSONStoreConfig{})
	case FormatDotenv:
		return sopsdotenv.NewStore(&config.DotenvStoreConfig{})
	case FormatBinary:
		return sopsjson.NewBinaryStore(&config.JSONBinaryStoreConfig{})
	default:
		return sopsyaml.NewStore(&config.YAMLStoreConfig{})
	}
}

// Recipient is a key a file is encrypted for: an age identity (only its
// public half is used) or an OpenPGP entity.
type Recipient struct {
	Age *age.X25519Identity
	PGP *openpgp.Entity
}

// Age is the recipient of an age identity.
func Age(id *age.X25519Identity) Recipient { return Recipient{Age: id} }

// PGP is the recipient of an OpenPGP entity.
func PGP(e *openpgp.Entity) Recipient { return Recipient{PGP: e} }

// Encrypt encrypts plain as `sops encrypt` does: the store of format f, a
// fresh data key wrapped for each recipient in one key group, the values
// whose keys match encryptedRegex encrypted ("" encrypts every value but
// those whose key ends in _unencrypted), and the MAC written. PGP
// envelopes are made with go-crypto in memory, since sops's PGP key source
// needs a GnuPG home.
func Encrypt(f Format, plain []byte, encryptedRegex string, to ...Recipient) ([]byte, error) {
	if len(to) == 0 {
		return nil, errors.New("encrypt: no recipient")
	}
	st := f.store()
	branches, err := st.LoadPlainFile(plain)
	if err != nil {
		return nil, fmt.Errorf("load plain file: %w", err)
	}
	dataKey := make([]byte, 32)
	if _, err := rand.Read(dataKey); err != nil {
		return nil, err
	}
	var group sops.KeyGroup
	for _, r := range to {
		var mk keys.MasterKey
		switch {
		case r.Age != nil:
			k, err := sopsage.MasterKeyFromRecipient(r.Age.Recipient().String())
			if err != nil {
				return nil, err
			}
			if err := k.Encrypt(dataKey); err != nil {
				return nil, fmt.Errorf("age wrap: %w", err)
			}
			mk = k
		case r.PGP != nil:
			wrapped, err := pgpWrap(r.PGP, dataKey)
			if err != nil {
				return nil, fmt.Errorf("pgp wrap: %w", err)
			}
			k := sopspgp.NewMasterKeyFromFingerprint(fmt.Sprintf("%X", r.PGP.PrimaryKey.Fingerprint))
			k.SetEncryptedDataKey(wrapped)
			mk = k
		default:
			return nil, errors.New("encrypt: empty recipient")
		}
		group = append(group, mk)
	}
	tree := sops.Tree{Branches: branches, Metadata: sops.Metadata{
		KeyGroups:      []sops.KeyGroup{group},
		EncryptedRegex: encryptedRegex,
		Version:        sopsVersion,
	}}
	if encryptedRegex == "" {
		tree.Metadata.UnencryptedSuffix = "_unencrypted"
	}
	cipher := sopsaes.NewCipher()
	mac, err := tree.Encrypt(dataKey, cipher)
	if err != nil {
		return nil, fmt.Errorf("encrypt tree: %w", err)
	}
	tree.Metadata.LastModified = time.Now().UTC()
	tree.Metadata.MessageAuthenticationCode, err = cipher.Encrypt(mac, dataKey, tree.Metadata.LastModified.Format(time.RFC3339))
	if err != nil {
		return nil, fmt.Errorf("encrypt mac: %w", err)
	}
	return st.EmitEncryptedFile(tree)
}

// MustEncrypt is Encrypt that fails the test on error.
func MustEncrypt(t testing.TB, f Format, plain []byte, encryptedRegex string, to ...Recipient) []byte {
	t.Helper()
	out, err := Encrypt(f, plain, encryptedRegex, to...)
	if err != nil {
		t.Fatalf("sops encrypt: %v", err)
	}
	return out
}

// EncryptSecretYAML encrypts the data and stringData of the Secrets of a
// YAML file for age identities, as docs/secrets.md tells an operator to.
func EncryptSecretYAML(t testing.TB, plain string, to ...*age.X25519Identity) string {
	t.Helper()
	var rs []Recipient
	for _, id := range to {
		rs = append(rs, Age(id))
	}
	return string(MustEncrypt(t, FormatYAML, []byte(plain), SecretDataRegex, rs...))
}

func pgpWrap(to *openpgp.Entity, dataKey []byte) ([]byte, error) {
	var buf bytes.Buffer
	aw, err := pgparmor.Encode(&buf, "PGP MESSAGE", nil)
	if err != nil {
		return nil, err
	}
	w, err := openpgp.Encrypt(aw, openpgp.EntityList{to}, nil, nil, nil)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(dataKey); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	if err := aw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// NewAgeKey is a fresh age identity, as age-keygen makes.
func NewAgeKey(t testing.TB) *age.X25519Identity {
	t.Helper()
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// AgeKeyFile is id as age-keygen writes it to keys.txt.
func AgeKeyFile(id *age.X25519Identity) []byte {
	return []byte("# created: " + time.Now().UTC().Format(time.RFC3339) + "\n# public key: " + id.Recipient().String() + "\n" + id.String() + "\n")
}

// NewPGPKey is a fresh OpenPGP entity without passphrase.
func NewPGPKey(t testing.TB) *openpgp.Entity {
	t.Helper()
	e, err := openpgp.NewEntity("capstan test", "", "test@capstan.dev", &packet.Config{Algorithm: packet.PubKeyAlgoEdDSA})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// ArmoredPrivate is e's private key as `gpg --export-secret-keys --armor`
// writes it.
func ArmoredPrivate(t testing.TB, e *openpgp.Entity) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := pgparmor.Encode(&buf, openpgp.PrivateKeyType, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SerializePrivate(w, nil); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// IsEncrypted reports whether data already went through sops: it holds
// encrypted values and a MAC.
func IsEncrypted(data []byte) bool {
	return bytes.Contains(data, []byte("ENC[AES256_GCM,")) && (bytes.Contains(data, []byte("mac:")) || bytes.Contains(data, []byte(`"mac"`)) || bytes.Contains(data, []byte("sops_mac=")))
}
