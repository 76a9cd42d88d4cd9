package render

import (
	"testing"
	"testing/fstest"
)

// TestFromEncrypted: an object counts as encrypted in git when its
// document's file is a sops file, or when every file its generator reads
// is one, through an overlay that renames and namespaces the objects,
// with or without the key; only without the key does it hold ciphertext.
func TestFromEncrypted(t *testing.T) {
	ageKey := newAgeKey(t)
	env := encryptSops(t, formatDotenv, []byte("PASSWORD="+planted+"\n"), "", recipient{age: ageKey})
	fsys := fstest.MapFS{
		"base/kustomization.yaml": file([]byte("resources: [bmc.yaml, plain.yaml, notes.yaml]\nsecretGenerator:\n" +
			"- name: sealed\n  envs: [sealed.env]\n" +
			"- name: mixed\n  envs: [sealed.env]\n  files: [note.txt]\n" +
			"- name: nohash\n  envs: [sealed.env]\n  options: {disableNameSuffixHash: true}\n" +
			"- name: bmc\n  envs: [sealed.env]\n- name: bmc-extra\n  files: [note.txt]\n")),
		"base/bmc.yaml":   file(encryptSops(t, formatYAML, []byte(bmcSecret), "^(data|stringData)$", recipient{age: ageKey})),
		"base/plain.yaml": file([]byte("apiVersion: v1\nkind: Secret\nmetadata: {name: plain}\nstringData: {a: b}\n")),
		// A plaintext document named like a generator reading only
		// encrypted files is judged by its own file.
		"base/notes.yaml":            file([]byte("apiVersion: v1\nkind: Secret\nmetadata: {name: sealed-notes}\nstringData: {a: b}\n")),
		"base/sealed.env":            file(env),
		"base/note.txt":              file([]byte("not encrypted\n")),
		"overlay/kustomization.yaml": file([]byte("resources: [../base]\nnamePrefix: edge-\nnamespace: metal\n")),
	}
	// Names without the hash suffix.
	want := map[string]bool{"edge-bmc-host-0": true, "edge-plain": false, "edge-sealed": true, "edge-mixed": false, "edge-nohash": true, "edge-bmc-extra": false, "edge-bmc": true, "edge-sealed-notes": false}
	for _, tc := range []struct {
		name string
		keys *Keys
	}{{"without a key", nil}, {"with the key", keysOf(t, ageKey)}} {
		t.Run(tc.name, func(t *testing.T) {
			opts := DefaultOptions()
			opts.Path = "overlay"
			opts.Decrypt = tc.keys
			res, err := BuildResult(t.Context(), fsys, opts)
			if err != nil {
				t.Fatal(err)
			}
			for name, encrypted := range want {
				i := indexOf(res, name)
				if i < 0 {
					t.Fatalf("no Secret %s", name)
				}
				obj := res.Objects[i]
				if got := res.FromEncrypted(i); got != encrypted {
					t.Errorf("%s (from %s): FromEncrypted = %v, want %v", obj.GetName(), res.Files[i], got, encrypted)
				}
				if got := res.HoldsCiphertext(obj); got != (encrypted && tc.keys == nil) {
					t.Errorf("%s: HoldsCiphertext = %v", obj.GetName(), got)
				}
			}
		})
	}
}

// indexOf finds the Secret of a name, hash suffix aside.
func indexOf(res *Result, name string) int {
	for i, o := range res.Objects {
		if cut, _ := withoutHashSuffix(o.GetName()); o.GetKind() == "Secret" && cut == name {
			return i
		}
	}
	return -1
}

// TestWithoutHashSuffix: only the suffix kustomize's hash makes is cut.
func TestWithoutHashSuffix(t *testing.T) {
	for in, want := range map[string]string{"bmc-k29dm9ghm4": "bmc", "bmc-creds": "bmc-creds", "bmc-abcdefghij": "bmc-abcdefghij", "-k29dm9ghm4": "-k29dm9ghm4"} {
		if got, _ := withoutHashSuffix(in); got != want {
			t.Errorf("withoutHashSuffix(%q) = %q, want %q", in, got, want)
		}
	}
}
