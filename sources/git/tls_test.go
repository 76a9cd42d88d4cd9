package git

import (
	"errors"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/testca"
	"github.com/capstan-dev/capstan/sources"
)

// tlsServer starts a git server over https whose certificate a private CA
// signed, with one repository, and returns its URL and head commit.
func tlsServer(t *testing.T) (ca *testca.CA, url, hash string) {
	t.Helper()
	ca = testca.Must(t, "capstan-git-test-ca")
	cert, err := ca.ServerCertificate()
	if err != nil {
		t.Fatal(err)
	}
	s, err := gitserver.New("", gitserver.Options{Username: testUser, Password: testPassword, TLSCertificate: &cert})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if url, err = s.CreateRepo("infra"); err != nil {
		t.Fatal(err)
	}
	if hash, err = s.Commit("infra", "main", clusterFiles, "initial"); err != nil {
		t.Fatal(err)
	}
	return ca, url, hash
}

func TestHTTPSWithPrivateCA(t *testing.T) {
	ca, url, hash := tlsServer(t)
	const where = "key ca.crt of Secret team-a/git-creds (spec.source.git.secretRef)"
	creds := func(extra map[string][]byte) map[string][]byte {
		data := map[string][]byte{"username": []byte(testUser), "password": []byte(testPassword)}
		for k, v := range extra {
			data[k] = v
		}
		return data
	}
	tests := []struct {
		name    string
		secret  map[string][]byte
		wantErr string // "": Revision and Fetch work
	}{
		{name: "the CA in ca.crt is trusted", secret: creds(map[string][]byte{"ca.crt": ca.PEM})},
		{name: "the CA in the older caFile is trusted", secret: creds(map[string][]byte{"caFile": ca.PEM})},
		{name: "without the CA the error says where to put it", secret: creds(nil),
			wantErr: "not signed by a CA Capstan trusts (the system roots plus ca.crt): if the server uses a private CA, put the CA's certificate (PEM) in " + where},
		{name: "another CA is not enough", secret: creds(map[string][]byte{"ca.crt": otherCA(t)}), wantErr: where},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			auth, err := AuthFromSecret(tt.secret)
			if err != nil {
				t.Fatal(err)
			}
			opts := Options{URL: url, Auth: auth, CredentialsFrom: CredentialsFrom{CA: where}}
			src, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			rev, revErr := src.Revision(ctx)
			if tt.wantErr == "" {
				if revErr != nil || rev != "main@sha1:"+hash {
					t.Fatalf("Revision = %q, %v; want main@sha1:%s", rev, revErr, hash)
				}
				art, err := src.Fetch(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer art.Remove()
				assertFiles(t, art.FS, clusterFiles)
				return
			}
			_, fetchErr := src.Fetch(ctx)
			for op, err := range map[string]error{"Revision": revErr, "Fetch": fetchErr} {
				if err == nil {
					t.Fatalf("%s succeeded, want an untrusted certificate error", op)
				}
				msg := err.Error()
				if !errors.Is(err, sources.ErrAuth) || !strings.Contains(msg, tt.wantErr) || !strings.Contains(msg, url) {
					t.Errorf("%s error %q: want sources.ErrAuth, the URL and %q", op, msg, tt.wantErr)
				}
				if strings.Contains(msg, testPassword) {
					t.Errorf("%s error %q shows the password", op, msg)
				}
			}
		})
	}
}

// otherCA is the certificate of a CA that signed nothing the tests serve.
func otherCA(t *testing.T) []byte {
	t.Helper()
	ca := testca.Must(t, "capstan-unrelated-ca")
	return ca.PEM
}

func TestAuthFromSecret(t *testing.T) {
	ca := testca.Must(t, "capstan-git-test-ca")
	got, err := AuthFromSecret(map[string][]byte{
		"username": []byte("alice"), "password": []byte("tok"), "identity": []byte("KEY"), "known_hosts": []byte("HOSTS"),
		"ca.crt": ca.PEM, "caFile": []byte("ignored when ca.crt is set"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if got.Username != "alice" || got.Password != "tok" || string(got.SSHPrivateKey) != "KEY" ||
		string(got.SSHKnownHosts) != "HOSTS" || string(got.CABundle) != string(ca.PEM) {
		t.Errorf("AuthFromSecret = %+v, want every key read, ca.crt before caFile", got)
	}
	const garbage = "not-a-certificate-Xq93"
	for _, key := range []string{"ca.crt", "caFile"} {
		t.Run("garbage in "+key, func(t *testing.T) {
			_, err := AuthFromSecret(map[string][]byte{key: []byte(garbage)})
			if err == nil || !strings.Contains(err.Error(), `key "`+key+`": holds no PEM certificate`) || strings.Contains(err.Error(), garbage) {
				t.Errorf("error %v: want one naming key %q, without the value", err, key)
			}
		})
	}
	t.Run("a CA bundle set by hand is checked too", func(t *testing.T) {
		_, err := New(Options{URL: "https://git.example/infra.git", Auth: Auth{CABundle: []byte(garbage)}})
		if !errors.Is(err, sources.ErrInvalid) || !strings.Contains(err.Error(), "key ca.crt of a Secret that spec.source.git.secretRef names") {
			t.Errorf("New with a garbage CABundle: %v, want an error naming where the CA is set", err)
		}
	})
}
