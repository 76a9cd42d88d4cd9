package git

import (
	"bytes"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"io"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"golang.org/x/crypto/ssh"

	"github.com/capstan-dev/capstan/sources"
)

// Verify says which keys may sign the head commit. With it set, Fetch
// refuses a head commit that is unsigned or signed by any other key, so
// nothing unsigned is ever rendered.
type Verify struct {
	// OpenPGPKeyRings are ASCII-armored OpenPGP public keys (gpg --armor
	// --export).
	OpenPGPKeyRings []string
	// SSHKeys are SSH public keys in authorized_keys format, one or more
	// lines each, for commits signed with gpg.format=ssh.
	SSHKeys [][]byte
}

// sshSigNamespace is the namespace git signs commits in.
const sshSigNamespace = "git"

// verifier checks commit signatures against parsed keys.
type verifier struct {
	pgp    []string
	sshKey []ssh.PublicKey
}

func newVerifier(v *Verify) (*verifier, error) {
	out := &verifier{pgp: v.OpenPGPKeyRings}
	for i, data := range v.SSHKeys {
		rest := data
		for len(bytes.TrimSpace(rest)) > 0 {
			key, _, _, next, err := ssh.ParseAuthorizedKey(rest)
			if err != nil {
				return nil, fmt.Errorf("%w: SSH verification key %d is not in authorized_keys format (ssh-ed25519 AAAA...): %w", sources.ErrInvalid, i+1, err)
			}
			out.sshKey = append(out.sshKey, key)
			rest = next
		}
	}
	if len(out.pgp) == 0 && len(out.sshKey) == 0 {
		return nil, fmt.Errorf("%w: commit verification needs at least one OpenPGP or SSH public key", sources.ErrInvalid)
	}
	return out, nil
}

// verify returns nil when c is signed by one of the keys, or an error that
// wraps sources.ErrRefused and says what is wrong with the signature.
func (v *verifier) verify(c *object.Commit) error {
	sig := strings.TrimSpace(c.PGPSignature)
	switch {
	case sig == "":
		return fmt.Errorf("%w: commit %s is not signed, and the source requires signed commits: sign it (git commit -S) or remove spec.source.git.verify",
			sources.ErrRefused, c.Hash)
	case strings.HasPrefix(sig, "-----BEGIN SSH SIGNATURE-----"):
		if len(v.sshKey) == 0 {
			return fmt.Errorf("%w: commit %s has an SSH signature, and no SSH key is trusted", sources.ErrRefused, c.Hash)
		}
		msg := &plumbing.MemoryObject{}
		if err := c.EncodeWithoutSignature(msg); err != nil {
			return fmt.Errorf("verify commit %s: %w", c.Hash, err)
		}
		r, err := msg.Reader()
		if err != nil {
			return fmt.Errorf("verify commit %s: %w", c.Hash, err)
		}
		data, err := io.ReadAll(r)
		if err != nil {
			return fmt.Errorf("verify commit %s: %w", c.Hash, err)
		}
		if err := verifySSHSig(sig, data, v.sshKey); err != nil {
			return fmt.Errorf("%w: commit %s: %w", sources.ErrRefused, c.Hash, err)
		}
		return nil
	case strings.HasPrefix(sig, "-----BEGIN PGP SIGNATURE-----"):
		if len(v.pgp) == 0 {
			return fmt.Errorf("%w: commit %s has an OpenPGP signature, and no OpenPGP key is trusted", sources.ErrRefused, c.Hash)
		}
		var errs []string
		for i, ring := range v.pgp {
			entity, err := c.Verify(ring)
			if err == nil && entity != nil {
				return nil
			}
			errs = append(errs, fmt.Sprintf("key %d: %v", i+1, err))
		}
		return fmt.Errorf("%w: commit %s: the OpenPGP signature verifies with none of the trusted keys (%s)",
			sources.ErrRefused, c.Hash, strings.Join(errs, "; "))
	default:
		return fmt.Errorf("%w: commit %s has a signature of a kind Capstan does not verify (X.509?); use OpenPGP or SSH", sources.ErrRefused, c.Hash)
	}
}

// verifySSHSig verifies an armored SSHSIG signature (the format of
// ssh-keygen -Y sign, which git uses for gpg.format=ssh) of message, made
// in the git namespace by one of keys.
func verifySSHSig(armored string, message []byte, keys []ssh.PublicKey) error {
	body := strings.TrimSpace(armored)
	body = strings.TrimPrefix(body, "-----BEGIN SSH SIGNATURE-----")
	body = strings.TrimSuffix(body, "-----END SSH SIGNATURE-----")
	raw, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(body), ""))
	if err != nil {
		return errors.New("the SSH signature is not base64")
	}
	const magic = "SSHSIG"
	if !bytes.HasPrefix(raw, []byte(magic)) {
		return errors.New("the SSH signature lacks the SSHSIG preamble")
	}
	var blob struct {
		Version   uint32
		PublicKey []byte
		Namespace string
		Reserved  string
		HashAlg   string
		Signature []byte
	}
	if err := ssh.Unmarshal(raw[len(magic):], &blob); err != nil {
		return fmt.Errorf("the SSH signature does not parse: %w", err)
	}
	if blob.Version != 1 {
		return fmt.Errorf("SSH signature version %d is not supported", blob.Version)
	}
	if blob.Namespace != sshSigNamespace {
		return fmt.Errorf("the SSH signature is for namespace %q, not %q", blob.Namespace, sshSigNamespace)
	}
	signer, err := ssh.ParsePublicKey(blob.PublicKey)
	if err != nil {
		return fmt.Errorf("the SSH signature's key does not parse: %w", err)
	}
	trusted := false
	for _, k := range keys {
		if bytes.Equal(k.Marshal(), signer.Marshal()) {
			trusted = true
			break
		}
	}
	if !trusted {
		return fmt.Errorf("signed with the SSH key %s, which is not trusted", ssh.FingerprintSHA256(signer))
	}
	var h hash.Hash
	switch blob.HashAlg {
	case "sha256":
		h = sha256.New()
	case "sha512":
		h = sha512.New()
	default:
		return fmt.Errorf("SSH signature hash %q is not supported", blob.HashAlg)
	}
	h.Write(message)
	var sig ssh.Signature
	if err := ssh.Unmarshal(blob.Signature, &sig); err != nil {
		return fmt.Errorf("the SSH signature does not parse: %w", err)
	}
	signed := append([]byte(magic), ssh.Marshal(struct {
		Namespace string
		Reserved  string
		HashAlg   string
		Hash      []byte
	}{blob.Namespace, blob.Reserved, blob.HashAlg, h.Sum(nil)})...)
	if err := signer.Verify(signed, &sig); err != nil {
		return fmt.Errorf("the SSH signature does not match the commit (signed by %s): %w", ssh.FingerprintSHA256(signer), err)
	}
	return nil
}
