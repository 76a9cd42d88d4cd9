package render

import (
	"bytes"
	"crypto/rand"
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
	"github.com/getsops/sops/v3/keys"
	sopspgp "github.com/getsops/sops/v3/pgp"
)

// sopsStore is what encryptSops needs of a sops store.
type sopsStore interface {
	LoadPlainFile(in []byte) (sops.TreeBranches, error)
	EmitEncryptedFile(sops.Tree) ([]byte, error)
}

// recipient is a key a test file is encrypted for.
type recipient struct {
	age *age.X25519Identity
	pgp *openpgp.Entity
}

// encryptSops encrypts plain as `sops encrypt` does, with the sops library
// itself: the store of format f, a fresh data key wrapped for each
// recipient, values matching encryptedRegex ("" for all) encrypted and the
// MAC written. PGP envelopes are made with go-crypto in memory, since sops's
// PGP key source reads a GnuPG home.
func encryptSops(t *testing.T, f format, plain []byte, encryptedRegex string, to ...recipient) []byte {
	t.Helper()
	st := f.store().(sopsStore)
	branches, err := st.LoadPlainFile(plain)
	if err != nil {
		t.Fatalf("load plain file: %v", err)
	}
	dataKey := make([]byte, 32)
	if _, err := rand.Read(dataKey); err != nil {
		t.Fatal(err)
	}
	var group sops.KeyGroup
	for _, r := range to {
		var mk keys.MasterKey
		switch {
		case r.age != nil:
			k, err := sopsage.MasterKeyFromRecipient(r.age.Recipient().String())
			if err != nil {
				t.Fatal(err)
			}
			if err := k.Encrypt(dataKey); err != nil {
				t.Fatalf("age wrap: %v", err)
			}
			mk = k
		case r.pgp != nil:
			k := sopspgp.NewMasterKeyFromFingerprint(fmt.Sprintf("%X", r.pgp.PrimaryKey.Fingerprint))
			k.SetEncryptedDataKey(pgpWrap(t, r.pgp, dataKey))
			mk = k
		}
		group = append(group, mk)
	}
	tree := sops.Tree{Branches: branches, Metadata: sops.Metadata{
		KeyGroups:      []sops.KeyGroup{group},
		EncryptedRegex: encryptedRegex,
		Version:        "3.13.3",
	}}
	if encryptedRegex == "" {
		tree.Metadata.UnencryptedSuffix = "_unencrypted"
	}
	cipher := sopsaes.NewCipher()
	mac, err := tree.Encrypt(dataKey, cipher)
	if err != nil {
		t.Fatalf("encrypt tree: %v", err)
	}
	tree.Metadata.LastModified = time.Now().UTC()
	tree.Metadata.MessageAuthenticationCode, err = cipher.Encrypt(mac, dataKey, tree.Metadata.LastModified.Format(time.RFC3339))
	if err != nil {
		t.Fatalf("encrypt mac: %v", err)
	}
	out, err := st.EmitEncryptedFile(tree)
	if err != nil {
		t.Fatalf("emit: %v", err)
	}
	return out
}

func pgpWrap(t *testing.T, to *openpgp.Entity, dataKey []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	aw, err := pgparmor.Encode(&buf, "PGP MESSAGE", nil)
	if err != nil {
		t.Fatal(err)
	}
	w, err := openpgp.Encrypt(aw, openpgp.EntityList{to}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(dataKey); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := aw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func newAgeKey(t *testing.T) *age.X25519Identity {
	t.Helper()
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func newPGPKey(t *testing.T) *openpgp.Entity {
	t.Helper()
	e, err := openpgp.NewEntity("capstan test", "", "test@capstan.dev", &packet.Config{Algorithm: packet.PubKeyAlgoEdDSA})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// armoredPrivate is e's private key as `gpg --export-secret-keys --armor`
// writes it.
func armoredPrivate(t *testing.T, e *openpgp.Entity) []byte {
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

// keysOf parses key files made from ids, as a decryption Secret holds them.
func keysOf(t *testing.T, ids ...any) *Keys {
	t.Helper()
	files := map[string][]byte{}
	for i, id := range ids {
		switch k := id.(type) {
		case *age.X25519Identity:
			files[fmt.Sprintf("k%d%s", i, AgeKeySuffix)] = []byte("# created: test\n" + k.String() + "\n")
		case *openpgp.Entity:
			files[fmt.Sprintf("k%d%s", i, PGPKeySuffix)] = armoredPrivate(t, k)
		}
	}
	keys, err := ParseKeys(files)
	if err != nil {
		t.Fatalf("parse keys: %v", err)
	}
	return keys
}

func pgparmorEncode(w *bytes.Buffer) (interface {
	Write([]byte) (int, error)
	Close() error
}, error) {
	return pgparmor.Encode(w, openpgp.PublicKeyType, nil)
}
