package render

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"testing/fstest"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/capstan-dev/capstan/failure"
)

// planted is a value every test file hides; it must never be in an error.
const planted = "hunter2-PLANTED-bmc-password"

const bmcSecret = `apiVersion: v1
kind: Secret
metadata:
  name: bmc-host-0
  namespace: metal
stringData:
  username: admin
  password: ` + planted + `
`

const credentialsDoc = `apiVersion: example.capstan.dev/v1
kind: RegistryCredential
metadata:
  name: mirror
spec:
  server: registry.example.com
  password: ` + planted + `
`

func decryptBuild(t *testing.T, fsys fstest.MapFS, keys *Keys) (*Result, error) {
	t.Helper()
	opts := DefaultOptions()
	opts.Decrypt = keys
	return BuildResult(context.Background(), fsys, opts)
}

func file(data []byte) *fstest.MapFile { return &fstest.MapFile{Data: data} }

func findObject(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && strings.HasPrefix(o.GetName(), name) {
			return o
		}
	}
	t.Fatalf("no %s/%s among %d objects", kind, name, len(objs))
	return nil
}

// TestDecryptRendersPlaintext: files encrypted with the sops library, for
// age and for OpenPGP keys, in each store a kustomization reads, render
// decrypted; objects from sops documents are marked as decrypted.
func TestDecryptRendersPlaintext(t *testing.T) {
	ageKey, pgpKey := newAgeKey(t), newPGPKey(t)
	keys := keysOf(t, ageKey, pgpKey)
	for _, tc := range []struct {
		name  string
		fsys  func(t *testing.T) fstest.MapFS
		check func(t *testing.T, res *Result)
	}{{
		name: "a Secret's stringData, age",
		fsys: func(t *testing.T) fstest.MapFS {
			return fstest.MapFS{
				"kustomization.yaml": file([]byte("namespace: metal\nresources: [bmc.sops.yaml]\n")),
				"bmc.sops.yaml":      file(encryptSops(t, formatYAML, []byte(bmcSecret), "^(data|stringData)$", recipient{age: ageKey})),
			}
		},
		check: func(t *testing.T, res *Result) {
			s := findObject(t, res.Objects, "Secret", "bmc-host-0")
			if got, _, _ := unstructured.NestedString(s.Object, "stringData", "password"); got != planted {
				t.Errorf("password = %q, want the plaintext", got)
			}
			if !IsDecrypted(s.GetAnnotations()) {
				t.Errorf("Secret not marked %s", DecryptedAnnotation)
			}
			if _, found := s.Object["sops"]; found {
				t.Error("the sops block reached the object")
			}
		},
	}, {
		name: "a whole non-Secret document, OpenPGP",
		fsys: func(t *testing.T) fstest.MapFS {
			return fstest.MapFS{
				"kustomization.yaml": file([]byte("resources: [cred.yaml]\n")),
				"cred.yaml":          file(encryptSops(t, formatYAML, []byte(credentialsDoc), "^spec$", recipient{pgp: pgpKey})),
			}
		},
		check: func(t *testing.T, res *Result) {
			o := findObject(t, res.Objects, "RegistryCredential", "mirror")
			if got, _, _ := unstructured.NestedString(o.Object, "spec", "password"); got != planted {
				t.Errorf("spec.password = %q, want the plaintext", got)
			}
			if !IsDecrypted(o.GetAnnotations()) {
				t.Errorf("decrypted document not marked %s", DecryptedAnnotation)
			}
		},
	}, {
		name: "a ConfigMap document, its data encrypted",
		fsys: func(t *testing.T) fstest.MapFS {
			cm := []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: vendor}\ndata: {token: " + planted + "}\n")
			return fstest.MapFS{
				"kustomization.yaml": file([]byte("resources: [vendor.yaml]\n")),
				"vendor.yaml":        file(encryptSops(t, formatYAML, cm, "^data$", recipient{age: ageKey})),
			}
		},
		check: func(t *testing.T, res *Result) {
			o := findObject(t, res.Objects, "ConfigMap", "vendor")
			if got, _, _ := unstructured.NestedString(o.Object, "data", "token"); got != planted {
				t.Errorf("data.token = %q, want the plaintext", got)
			}
			if !IsDecrypted(o.GetAnnotations()) {
				t.Errorf("decrypted ConfigMap not marked %s", DecryptedAnnotation)
			}
		},
	}, {
		name: "a JSON document, age and OpenPGP recipients, only the PGP key held",
		fsys: func(t *testing.T) fstest.MapFS {
			js := []byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"token"},"stringData":{"token":"` + planted + `"}}`)
			return fstest.MapFS{
				"kustomization.yaml": file([]byte("resources: [token.json]\n")),
				"token.json":         file(encryptSops(t, formatJSON, js, "^stringData$", recipient{age: newAgeKey(t)}, recipient{pgp: pgpKey})),
			}
		},
		check: func(t *testing.T, res *Result) {
			s := findObject(t, res.Objects, "Secret", "token")
			if got, _, _ := unstructured.NestedString(s.Object, "stringData", "token"); got != planted {
				t.Errorf("token = %q", got)
			}
		},
	}, {
		name: "a secretGenerator env file (dotenv)",
		fsys: func(t *testing.T) fstest.MapFS {
			return fstest.MapFS{
				"kustomization.yaml": file([]byte("secretGenerator:\n- name: bmc\n  envs: [bmc.env]\n")),
				"bmc.env":            file(encryptSops(t, formatDotenv, []byte("USERNAME=admin\nPASSWORD="+planted+"\n"), "", recipient{age: ageKey})),
			}
		},
		check: func(t *testing.T, res *Result) {
			s := findObject(t, res.Objects, "Secret", "bmc-")
			data, _, _ := unstructured.NestedStringMap(s.Object, "data")
			if got, _ := base64.StdEncoding.DecodeString(data["PASSWORD"]); string(got) != planted {
				t.Errorf("PASSWORD = %q; data keys %v", got, keysOfMap(data))
			}
			for k := range data {
				if strings.HasPrefix(k, "sops_") {
					t.Errorf("sops metadata key %s reached the Secret", k)
				}
			}
			if !IsDecrypted(s.GetAnnotations()) {
				t.Errorf("generated Secret not marked %s", DecryptedAnnotation)
			}
		},
	}, {
		name: "a secretGenerator binary file",
		fsys: func(t *testing.T) fstest.MapFS {
			bin := append([]byte{0, 1, 2, 0xff}, []byte(planted)...)
			return fstest.MapFS{
				"kustomization.yaml": file([]byte("secretGenerator:\n- name: tls\n  files: [key.der=host.der]\n")),
				"host.der":           file(encryptSops(t, formatBinary, bin, "", recipient{age: ageKey})),
			}
		},
		check: func(t *testing.T, res *Result) {
			s := findObject(t, res.Objects, "Secret", "tls-")
			data, _, _ := unstructured.NestedStringMap(s.Object, "data")
			got, _ := base64.StdEncoding.DecodeString(data["key.der"])
			if want := append([]byte{0, 1, 2, 0xff}, []byte(planted)...); !bytes.Equal(got, want) {
				t.Errorf("key.der = %q, want %q", got, want)
			}
			if !IsDecrypted(s.GetAnnotations()) {
				t.Errorf("generated Secret not marked %s", DecryptedAnnotation)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := decryptBuild(t, tc.fsys(t), keys)
			if err != nil {
				t.Fatalf("build: %v", err)
			}
			tc.check(t, res)
		})
	}
}

// A Secret a secretGenerator makes is marked decrypted when one file it
// reads was decrypted, among plaintext ones too, through a namePrefix and
// the hash suffix; a generator beside it that reads only plaintext is
// not, nor is a plaintext Secret document.
func TestDecryptMarksGeneratedSecrets(t *testing.T) {
	ageKey := newAgeKey(t)
	fsys := fstest.MapFS{
		"kustomization.yaml": file([]byte(`namePrefix: edge-
resources: [plain.yaml]
secretGenerator:
- name: bmc
  envs: [bmc.env]
  files: [motd.txt]
- name: bmc-banner
  files: [motd.txt]
`)),
		"bmc.env":    file(encryptSops(t, formatDotenv, []byte("PASSWORD="+planted+"\n"), "", recipient{age: ageKey})),
		"motd.txt":   file([]byte("welcome\n")),
		"plain.yaml": file([]byte("apiVersion: v1\nkind: Secret\nmetadata: {name: bmc-notes}\nstringData: {note: hello}\n")),
	}
	res, err := decryptBuild(t, fsys, keysOf(t, ageKey))
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	for name, want := range map[string]bool{"edge-bmc-": true, "edge-bmc-banner-": false, "edge-bmc-notes": false} {
		var found *unstructured.Unstructured
		for _, o := range res.Objects {
			if o.GetKind() != "Secret" {
				continue
			}
			// edge-bmc- prefixes the others' names: match the whole name
			// but the hash suffix.
			if n := o.GetName(); n == name || strings.HasSuffix(name, "-") && strings.HasPrefix(n, name) && len(n) == len(name)+10 {
				found = o
			}
		}
		if found == nil {
			t.Fatalf("no Secret %s* among %d objects", name, len(res.Objects))
		}
		if got := IsDecrypted(found.GetAnnotations()); got != want {
			t.Errorf("Secret %s marked decrypted = %v, want %v", found.GetName(), got, want)
		}
	}
}

func keysOfMap(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestDecryptFailures: each way a sops file cannot be decrypted is its own
// stalled reason, names the file, the object and the recipients, and
// never carries key material or plaintext.
func TestDecryptFailures(t *testing.T) {
	ageKey, other := newAgeKey(t), newAgeKey(t)
	encrypted := func(t *testing.T) []byte {
		return encryptSops(t, formatYAML, []byte(bmcSecret), "^(data|stringData)$", recipient{age: ageKey})
	}
	overlay := func(data []byte) fstest.MapFS {
		return fstest.MapFS{
			"kustomization.yaml": file([]byte("resources: [bmc.yaml]\n")),
			"bmc.yaml":           file(data),
		}
	}
	for _, tc := range []struct {
		name       string
		fsys       func(t *testing.T) fstest.MapFS
		keys       *Keys
		reason     string
		file       string
		object     string
		recipients bool
	}{{
		name: "no key given", keys: &Keys{},
		fsys:   func(t *testing.T) fstest.MapFS { return overlay(encrypted(t)) },
		reason: ReasonDecryptionKeyMissing, file: "bmc.yaml", object: "Secret/metal/bmc-host-0", recipients: true,
	}, {
		name: "a wrong key", keys: keysOf(t, other),
		fsys:   func(t *testing.T) fstest.MapFS { return overlay(encrypted(t)) },
		reason: ReasonDecryptionKeyMismatch, file: "bmc.yaml", object: "Secret/metal/bmc-host-0", recipients: true,
	}, {
		name: "a tampered MAC", keys: keysOf(t, ageKey),
		fsys: func(t *testing.T) fstest.MapFS {
			// Renaming the object leaves every encrypted value intact
			// but breaks the MAC, which covers unencrypted values too.
			return overlay(bytes.Replace(encrypted(t), []byte("name: bmc-host-0"), []byte("name: bmc-host-9"), 1))
		},
		reason: ReasonDecryptionMACMismatch, file: "bmc.yaml", object: "Secret/metal/bmc-host-9",
	}, {
		name: "a tampered value", keys: keysOf(t, ageKey),
		fsys: func(t *testing.T) fstest.MapFS {
			data := encrypted(t)
			// Swap two encrypted values: each is bound to its path.
			lines := strings.Split(string(data), "\n")
			var u, p int
			for i, l := range lines {
				if strings.Contains(l, "username: ENC[") {
					u = i
				}
				if strings.Contains(l, "password: ENC[") {
					p = i
				}
			}
			lines[u], lines[p] = strings.Replace(lines[p], "password", "username", 1), strings.Replace(lines[u], "username", "password", 1)
			return overlay([]byte(strings.Join(lines, "\n")))
		},
		reason: ReasonDecryptionMACMismatch, file: "bmc.yaml", object: "Secret/metal/bmc-host-0",
	}, {
		name: "a missing sops block", keys: keysOf(t, ageKey),
		fsys: func(t *testing.T) fstest.MapFS {
			data := encrypted(t)
			return overlay(data[:bytes.Index(data, []byte("\nsops:"))+1])
		},
		reason: ReasonDecryptionMetadataMissing, file: "bmc.yaml", object: "Secret/metal/bmc-host-0",
	}, {
		name: "a secretGenerator env file without a key", keys: &Keys{},
		fsys: func(t *testing.T) fstest.MapFS {
			return fstest.MapFS{
				"kustomization.yaml": file([]byte("namespace: metal\nsecretGenerator:\n- name: bmc\n  namespace: metal\n  envs: [bmc.env]\n")),
				"bmc.env":            file(encryptSops(t, formatDotenv, []byte("PASSWORD="+planted+"\n"), "", recipient{age: ageKey})),
			}
		},
		reason: ReasonDecryptionKeyMissing, file: "bmc.env", object: "Secret/metal/bmc", recipients: true,
	}, {
		name: "a secretGenerator binary file with a wrong key", keys: keysOf(t, other),
		fsys: func(t *testing.T) fstest.MapFS {
			return fstest.MapFS{
				"kustomization.yaml": file([]byte("secretGenerator:\n- name: tls\n  files: [host.der]\n")),
				"host.der":           file(encryptSops(t, formatBinary, []byte(planted), "", recipient{age: ageKey})),
			}
		},
		reason: ReasonDecryptionKeyMismatch, file: "host.der", object: "Secret/tls", recipients: true,
	}, {
		name: "an encrypted file read by a configMapGenerator", keys: keysOf(t, ageKey),
		fsys: func(t *testing.T) fstest.MapFS {
			return fstest.MapFS{
				"kustomization.yaml": file([]byte("configMapGenerator:\n- name: settings\n  envs: [app.env]\n")),
				"app.env":            file(encryptSops(t, formatDotenv, []byte("PASSWORD="+planted+"\n"), "", recipient{age: ageKey})),
			}
		},
		reason: ReasonDecryptionFailed, file: "app.env", object: "ConfigMap/settings",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := decryptBuild(t, tc.fsys(t), tc.keys)
			if err == nil {
				t.Fatalf("build succeeded with %d objects, want %s", len(res.Objects), tc.reason)
			}
			msg := err.Error()
			f, ok := failure.From(err)
			if !ok || f.Reason != tc.reason || f.Policy != failure.PolicyStalled {
				t.Fatalf("failure = %+v, want stalled %s; error: %s", f, tc.reason, msg)
			}
			var re *Error
			if !errors.As(err, &re) || re.File != tc.file || re.Object != tc.object {
				t.Errorf("error names file %q object %q, want %q %q: %s", re.File, re.Object, tc.file, tc.object, msg)
			}
			if tc.recipients && !strings.Contains(msg, ageKey.Recipient().String()) {
				t.Errorf("error does not name the recipient %s: %s", ageKey.Recipient(), msg)
			}
			for _, leak := range []string{planted, ageKey.String(), other.String(), "AGE-SECRET-KEY"} {
				if strings.Contains(msg, leak) {
					t.Errorf("error leaks %q: %s", leak, msg)
				}
			}
		})
	}
}

// TestDecryptReportsEveryFileAtOnce: two files that fail are reported
// together, so one commit can fix both.
func TestDecryptReportsEveryFileAtOnce(t *testing.T) {
	ageKey := newAgeKey(t)
	enc := encryptSops(t, formatYAML, []byte(bmcSecret), "^(data|stringData)$", recipient{age: ageKey})
	fsys := fstest.MapFS{
		"kustomization.yaml": file([]byte("resources: [a.yaml, b.yaml]\n")),
		"a.yaml":             file(enc),
		"b.yaml":             file(bytes.Replace(enc, []byte("bmc-host-0"), []byte("bmc-host-1"), 1)),
	}
	_, err := decryptBuild(t, fsys, &Keys{})
	if err == nil || !strings.Contains(err.Error(), "a.yaml") || !strings.Contains(err.Error(), "b.yaml") {
		t.Fatalf("want both files named, got %v", err)
	}
}

// TestDecryptOffLeavesCiphertext: without Options.Decrypt (capstan render
// without a key) files are built as they are in git.
func TestDecryptOffLeavesCiphertext(t *testing.T) {
	ageKey := newAgeKey(t)
	fsys := fstest.MapFS{
		"kustomization.yaml": file([]byte("resources: [bmc.yaml]\n")),
		"bmc.yaml":           file(encryptSops(t, formatYAML, []byte(bmcSecret), "^(data|stringData)$", recipient{age: ageKey})),
	}
	res, err := decryptBuild(t, fsys, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := findObject(t, res.Objects, "Secret", "bmc-host-0")
	if got, _, _ := unstructured.NestedString(s.Object, "stringData", "password"); !strings.HasPrefix(got, "ENC[") {
		t.Errorf("password = %q, want ciphertext", got)
	}
	if IsDecrypted(s.GetAnnotations()) {
		t.Error("ciphertext marked as decrypted")
	}
}

// TestParseKeysRefusesUnusableKeys: key files that cannot serve say why,
// without quoting their content.
func TestParseKeysRefusesUnusableKeys(t *testing.T) {
	pgpKey := newPGPKey(t)
	var pub bytes.Buffer
	w, _ := pgparmorEncode(&pub)
	_ = pgpKey.Serialize(w)
	_ = w.Close()
	for _, tc := range []struct {
		name, file, content, reason string
	}{
		{"an ssh key in an agekey file", "id.agekey", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIsecretish\n", ReasonDecryptionUnsupportedKey},
		{"an age plugin identity", "yubi.agekey", "AGE-PLUGIN-YUBIKEY-1QQQSECRETISH\n", ReasonDecryptionUnsupportedKey},
		{"garbage in an agekey file", "bad.agekey", "AGE-SECRET-KEY-1NOTREALLYSECRETISH\n", ReasonDecryptionFailed},
		{"a public OpenPGP key", "pub.asc", pub.String(), ReasonDecryptionUnsupportedKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseKeys(map[string][]byte{tc.file: []byte(tc.content), "README": []byte("notes are skipped")})
			var ke *KeyFileError
			if !errors.As(err, &ke) || ke.Reason != tc.reason || ke.File != tc.file {
				t.Fatalf("got %v, want %s for %s", err, tc.reason, tc.file)
			}
			if strings.Contains(err.Error(), "SECRETISH") || strings.Contains(err.Error(), "secretish") {
				t.Errorf("error quotes the key: %v", err)
			}
		})
	}
}

// DecryptFile opens one file as a build would, leaves plaintext alone,
// and names the recipients when the key is not one of them.
func TestDecryptFile(t *testing.T) {
	key := newAgeKey(t)
	enc := encryptSops(t, formatYAML, []byte(bmcSecret), "^(data|stringData)$", recipient{age: key})
	plain, err := DecryptFile("bmc.yaml", enc, keysOf(t, key))
	if err != nil || !strings.Contains(string(plain), planted) || strings.Contains(string(plain), "sops:") {
		t.Errorf("DecryptFile = %q, %v; want the plaintext without the sops block", plain, err)
	}
	if same, err := DecryptFile("bmc.yaml", []byte(bmcSecret), nil); err != nil || string(same) != bmcSecret {
		t.Errorf("a plaintext file: %q, %v", same, err)
	}
	other := newAgeKey(t)
	_, err = DecryptFile("bmc.yaml", enc, keysOf(t, other))
	var de *DecryptError
	if !errors.As(err, &de) || de.Reason != ReasonDecryptionKeyMismatch || !strings.Contains(err.Error(), key.Recipient().String()) {
		t.Errorf("wrong key: %v, want %s naming the recipient", err, ReasonDecryptionKeyMismatch)
	}
}
