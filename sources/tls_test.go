package sources

import (
	"encoding/pem"
	"regexp"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/internal/testca"
)

func TestCABundle(t *testing.T) {
	ca := testca.Must(t, "capstan-sources-test-ca")
	other := testca.Must(t, "capstan-other-ca")
	broken := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("not DER")})
	key := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("secret-key-bytes")})
	both := append(append([]byte{}, ca.PEM...), other.PEM...)
	for _, tt := range []struct {
		name    string
		data    map[string][]byte
		want    []byte
		wantErr string
	}{
		{name: "no CA key: nothing to add", data: map[string][]byte{"username": []byte("u")}},
		{name: "ca.crt", data: map[string][]byte{"ca.crt": ca.PEM}, want: ca.PEM},
		{name: "the older caFile", data: map[string][]byte{"caFile": ca.PEM}, want: ca.PEM},
		{name: "ca.crt wins over caFile", data: map[string][]byte{"ca.crt": ca.PEM, "caFile": other.PEM}, want: ca.PEM},
		{name: "several CAs one after the other", data: map[string][]byte{"ca.crt": both}, want: both},
		{name: "text that is no PEM", data: map[string][]byte{"ca.crt": []byte("hello")}, wantErr: `key "ca.crt": holds no PEM certificate`},
		{name: "an empty value", data: map[string][]byte{"caFile": nil}, wantErr: `key "caFile": holds no PEM certificate`},
		{name: "a private key by mistake", data: map[string][]byte{"ca.crt": key}, wantErr: `key "ca.crt": holds no PEM certificate`},
		{name: "a certificate that does not parse, after a good one", data: map[string][]byte{"ca.crt": append(append([]byte{}, ca.PEM...), broken...)},
			wantErr: `key "ca.crt": certificate 2 does not parse`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := CABundle(tt.data)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || strings.Contains(err.Error(), "secret-key-bytes") {
					t.Errorf("CABundle = %v, want an error containing %q that quotes no value", err, tt.wantErr)
				}
				return
			}
			if err != nil || string(got) != string(tt.want) {
				t.Errorf("CABundle = %q, %v; want %q", got, err, tt.want)
			}
			if got == nil {
				return
			}
			if _, err := HTTPTransport(got); err != nil {
				t.Errorf("HTTPTransport: %v", err)
			}
		})
	}
}

// FuzzCABundle: whatever a Secret holds, reading it does not panic, and
// an error is one of the fixed forms, which quote nothing of the value.
func FuzzCABundle(f *testing.F) {
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Add([]byte("plain-text-value-1234"))
	_, noPEM := CABundle(map[string][]byte{CAKey: []byte("x")})
	parse := regexp.MustCompile(`^key "ca\.crt": certificate [0-9]+ does not parse: x509: [a-zA-Z0-9 :,()./_-]*$`)
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := CABundle(map[string][]byte{CAKey: data})
		if err != nil && err.Error() != noPEM.Error() && !parse.MatchString(err.Error()) {
			t.Errorf("error %q is none of the fixed forms", err)
		}
	})
}
