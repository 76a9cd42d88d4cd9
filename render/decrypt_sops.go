package render

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"filippo.io/age"
	"filippo.io/age/armor"
	"github.com/ProtonMail/go-crypto/openpgp"
	pgparmor "github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/getsops/sops/v3"
	sopsaes "github.com/getsops/sops/v3/aes"
	sopsage "github.com/getsops/sops/v3/age"
	"github.com/getsops/sops/v3/config"
	"github.com/getsops/sops/v3/keys"
	sopspgp "github.com/getsops/sops/v3/pgp"
	"github.com/getsops/sops/v3/shamir"
	sopsdotenv "github.com/getsops/sops/v3/stores/dotenv"
	sopsjson "github.com/getsops/sops/v3/stores/json"
	sopsyaml "github.com/getsops/sops/v3/stores/yaml"
)

// format is how sops stored a file.
type format int

const (
	// formatPlain: not a sops file.
	formatPlain format = iota
	// formatNoMetadata: sops values without a sops block.
	formatNoMetadata
	formatYAML
	formatJSON
	formatDotenv
	// formatBinary: sops's JSON wrapping of an arbitrary file
	// ({"data": "ENC[...]", "sops": {...}}).
	formatBinary
)

// store is what render needs of a sops store.
type store interface {
	LoadEncryptedFile(in []byte) (sops.Tree, error)
	EmitPlainFile(branches sops.TreeBranches) ([]byte, error)
}

func (f format) store() store {
	switch f {
	case formatJSON:
		return sopsjson.NewStore(&config.JSONStoreConfig{})
	case formatDotenv:
		return sopsdotenv.NewStore(&config.DotenvStoreConfig{})
	case formatBinary:
		return sopsjson.NewBinaryStore(&config.JSONBinaryStoreConfig{})
	default:
		return sopsyaml.NewStore(&config.YAMLStoreConfig{})
	}
}

// encMarker starts every value sops encrypts.
var encMarker = []byte("ENC[AES256_GCM,")

// detect tells how the file p was stored by sops, by its content: sops
// itself picks the store by extension when encrypting, and the content
// says which one it was (a binary file becomes JSON with a data key, a
// dotenv file gets sops_* lines). A file that is not sops's is plain.
func detect(p string, data []byte) format {
	if !bytes.Contains(data, []byte("sops")) {
		if bytes.Contains(data, encMarker) {
			return formatNoMetadata
		}
		return formatPlain
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) > 0 && trimmed[0] == '{' {
		var top map[string]json.RawMessage
		if json.Unmarshal(trimmed, &top) == nil {
			if !isSopsMetadata(top["sops"]) {
				return noMetadataOrPlain(data)
			}
			if _, ok := top["data"]; ok && len(top) == 2 && path.Ext(p) != ".json" {
				return formatBinary
			}
			return formatJSON
		}
	}
	for _, line := range bytes.Split(data, []byte("\n")) {
		if bytes.HasPrefix(bytes.TrimSpace(line), []byte("sops_mac=")) {
			return formatDotenv
		}
	}
	// decodeDocuments bounds aliases before sops's own parser sees them.
	docs, err := decodeDocuments(data)
	if err != nil {
		return noMetadataOrPlain(data)
	}
	for _, d := range docs {
		if m, ok := d.object()["sops"].(map[string]interface{}); ok {
			if _, ok := m["mac"]; ok {
				return formatYAML
			}
		}
	}
	return noMetadataOrPlain(data)
}

func noMetadataOrPlain(data []byte) format {
	if bytes.Contains(data, encMarker) {
		return formatNoMetadata
	}
	return formatPlain
}

// isSopsMetadata reports whether raw is a JSON object with a mac, as a
// sops block is.
func isSopsMetadata(raw json.RawMessage) bool {
	var m map[string]json.RawMessage
	if raw == nil || json.Unmarshal(raw, &m) != nil {
		return false
	}
	_, ok := m["mac"]
	return ok
}

// decryptSops decrypts a sops file of format f with keys and checks its
// MAC, the way `sops decrypt` does, with the data key opened in memory by
// keys alone. The errors are *DecryptError.
func decryptSops(f format, data []byte, k *Keys) ([]byte, error) {
	st := f.store()
	tree, err := st.LoadEncryptedFile(data)
	if err != nil {
		if errors.Is(err, sops.MetadataNotFound) {
			return nil, &DecryptError{Reason: ReasonDecryptionMetadataMissing, Err: errors.New("no sops metadata block; encrypt the file again with sops")}
		}
		return nil, &DecryptError{Reason: ReasonDecryptionFailed, Err: fmt.Errorf("not a well-formed sops file: %w", err)}
	}
	dataKey, err := dataKey(tree.Metadata, k)
	if err != nil {
		return nil, err
	}
	cipher := sopsaes.NewCipher()
	mac, err := tree.Decrypt(dataKey, cipher)
	if err != nil {
		// The values are authenticated one by one with their path: one
		// that does not open was changed or moved.
		return nil, &DecryptError{Reason: ReasonDecryptionMACMismatch, Err: errors.New("an encrypted value does not match its authentication tag: the file was changed after sops encrypted it; encrypt it again with sops")}
	}
	stored, err := cipher.Decrypt(tree.Metadata.MessageAuthenticationCode, dataKey, tree.Metadata.LastModified.Format(time.RFC3339))
	if err != nil || stored != mac {
		return nil, &DecryptError{Reason: ReasonDecryptionMACMismatch, Err: errors.New("the file's MAC does not match its content: it was changed after sops encrypted it; edit it with `sops edit`, or encrypt it again")}
	}
	plain, err := st.EmitPlainFile(tree.Branches)
	if err != nil {
		return nil, &DecryptError{Reason: ReasonDecryptionFailed, Err: fmt.Errorf("write the decrypted file: %w", err)}
	}
	return plain, nil
}

// dataKey opens the file's data key: from one key of each key group
// (several groups are Shamir shares, of which the threshold is needed).
func dataKey(md sops.Metadata, k *Keys) ([]byte, error) {
	var (
		parts        [][]byte
		recipients   []string
		supported    bool
		held         bool
		openFailures []error
	)
	for _, group := range md.KeyGroups {
		part, err := openGroup(group, k, &recipients, &supported, &held)
		if err != nil {
			openFailures = append(openFailures, err)
			continue
		}
		if part != nil {
			parts = append(parts, part)
		}
	}
	need := 1
	if len(md.KeyGroups) > 1 {
		need = max(md.ShamirThreshold, 1)
	}
	if len(parts) >= need {
		if len(md.KeyGroups) <= 1 {
			return parts[0], nil
		}
		key, err := shamir.Combine(parts)
		if err != nil {
			return nil, &DecryptError{Reason: ReasonDecryptionFailed, Err: fmt.Errorf("combine the key groups' shares: %w", err)}
		}
		return key, nil
	}
	switch {
	case !supported:
		return nil, &DecryptError{Reason: ReasonDecryptionUnsupportedKey, Recipients: recipients,
			Err: errors.New("encrypted only for key types Capstan cannot hold (cloud KMS, Vault); add an age or OpenPGP recipient with `sops updatekeys`")}
	case k.Len() == 0:
		return nil, &DecryptError{Reason: ReasonDecryptionKeyMissing, Recipients: recipients,
			Err: errors.New("sops-encrypted, and no decryption key was given; set spec.decryption.secretRef to a Secret holding the age or OpenPGP key")}
	case held:
		return nil, &DecryptError{Reason: ReasonDecryptionKeyMismatch, Recipients: recipients,
			Err: fmt.Errorf("the key given could not open the file's data key (%w); encrypt the file again with sops", errors.Join(openFailures...))}
	default:
		return nil, &DecryptError{Reason: ReasonDecryptionKeyMismatch, Recipients: recipients,
			Err: fmt.Errorf("none of the keys given (%s) is a recipient; add one with `sops updatekeys`, or give the key it was encrypted for", strings.Join(k.Public(), ", "))}
	}
}

// openGroup opens the data key (or share) of one key group with the first
// of its keys that k holds. It notes the group's recipients, whether any
// is of a type Capstan holds, and whether k holds one.
func openGroup(group sops.KeyGroup, k *Keys, recipients *[]string, supported, held *bool) ([]byte, error) {
	var errs []error
	for _, mk := range group {
		switch key := mk.(type) {
		case *sopsage.MasterKey:
			*recipients = append(*recipients, key.Recipient)
			*supported = true
			if !k.hasAge(key.Recipient) {
				continue
			}
			*held = true
			part, err := openAge(key.EncryptedKey, k)
			if err == nil {
				return part, nil
			}
			errs = append(errs, err)
		case *sopspgp.MasterKey:
			*recipients = append(*recipients, "pgp:"+key.Fingerprint)
			*supported = true
			if !k.hasPGP(key.Fingerprint) {
				continue
			}
			*held = true
			part, err := openPGP(key.EncryptedKey, k)
			if err == nil {
				return part, nil
			}
			errs = append(errs, err)
		default:
			*recipients = append(*recipients, keyName(mk))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return nil, nil
}

// keyName names a master key of a type Capstan does not hold by its type
// and public identifier.
func keyName(mk keys.MasterKey) string {
	return mk.TypeToIdentifier() + ":" + mk.ToString()
}

// maxDataKey bounds what a data key envelope may decrypt to: sops's keys
// are 32 bytes, and an envelope is attacker-controlled.
const maxDataKey = 1024

func openAge(encrypted string, k *Keys) ([]byte, error) {
	ids := make([]age.Identity, len(k.age))
	for i, id := range k.age {
		ids[i] = id
	}
	r, err := age.Decrypt(armor.NewReader(strings.NewReader(encrypted)), ids...)
	if err != nil {
		return nil, fmt.Errorf("age: %w", err)
	}
	return readDataKey(r)
}

func openPGP(encrypted string, k *Keys) ([]byte, error) {
	block, err := pgparmor.Decode(strings.NewReader(encrypted))
	if err != nil {
		return nil, fmt.Errorf("openpgp: %w", err)
	}
	md, err := openpgp.ReadMessage(block.Body, k.pgp, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("openpgp: %w", err)
	}
	return readDataKey(md.UnverifiedBody)
}

func readDataKey(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxDataKey+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxDataKey {
		return nil, errors.New("data key envelope too large")
	}
	return b, nil
}
