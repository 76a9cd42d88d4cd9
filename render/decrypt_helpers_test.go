package render

import (
	"bytes"
	"fmt"
	"testing"

	"filippo.io/age"
	"github.com/ProtonMail/go-crypto/openpgp"
	pgparmor "github.com/ProtonMail/go-crypto/openpgp/armor"

	"github.com/capstan-dev/capstan/internal/sopstest"
)

// recipient is a key a test file is encrypted for.
type recipient struct {
	age *age.X25519Identity
	pgp *openpgp.Entity
}

// encryptSops encrypts plain as `sops encrypt` does, with the sops library
// itself (internal/sopstest), in the store of format f.
func encryptSops(t *testing.T, f format, plain []byte, encryptedRegex string, to ...recipient) []byte {
	t.Helper()
	sf := map[format]sopstest.Format{formatYAML: sopstest.FormatYAML, formatJSON: sopstest.FormatJSON,
		formatDotenv: sopstest.FormatDotenv, formatBinary: sopstest.FormatBinary}[f]
	var rs []sopstest.Recipient
	for _, r := range to {
		rs = append(rs, sopstest.Recipient{Age: r.age, PGP: r.pgp})
	}
	return sopstest.MustEncrypt(t, sf, plain, encryptedRegex, rs...)
}

func newAgeKey(t *testing.T) *age.X25519Identity { return sopstest.NewAgeKey(t) }

func newPGPKey(t *testing.T) *openpgp.Entity { return sopstest.NewPGPKey(t) }

// keysOf parses key files made from ids, as a decryption Secret holds them.
func keysOf(t *testing.T, ids ...any) *Keys {
	t.Helper()
	files := map[string][]byte{}
	for i, id := range ids {
		switch k := id.(type) {
		case *age.X25519Identity:
			files[fmt.Sprintf("k%d%s", i, AgeKeySuffix)] = sopstest.AgeKeyFile(k)
		case *openpgp.Entity:
			files[fmt.Sprintf("k%d%s", i, PGPKeySuffix)] = sopstest.ArmoredPrivate(t, k)
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
