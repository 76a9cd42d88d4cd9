package sources

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// CAKey is the key of a credentials Secret (the one a deployment's
// secretRef names) that holds PEM certificates of the CAs to trust for
// https on top of the system roots, as in Flux's secretRef Secrets.
const CAKey = "ca.crt"

// LegacyCAKey is the older name of CAKey that Flux still reads; CAKey wins
// when a Secret holds both.
const LegacyCAKey = "caFile"

// CABundle returns the CA certificates a credentials Secret's data holds
// (CAKey, else LegacyCAKey), nil when it holds neither. A value with no
// PEM certificate, or with one that does not parse, is refused with an
// error that names the key and never quotes the value.
func CABundle(data map[string][]byte) ([]byte, error) {
	for _, key := range []string{CAKey, LegacyCAKey} {
		bundle, ok := data[key]
		if !ok {
			continue
		}
		if err := checkBundle(bundle); err != nil {
			return nil, fmt.Errorf("key %q: %w", key, err)
		}
		return bundle, nil
	}
	return nil, nil
}

// checkBundle says why bundle is not a list of PEM certificates.
func checkBundle(bundle []byte) error {
	n := 0
	for rest := bundle; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		n++
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return fmt.Errorf("certificate %d does not parse: %w", n, err)
		}
	}
	if n == 0 {
		return errors.New(`holds no PEM certificate: put the CA's certificate(s) there in PEM ("-----BEGIN CERTIFICATE-----" blocks), e.g. kubectl create secret generic NAME --from-file=ca.crt=ca.pem`)
	}
	return nil
}

// CertPool returns the system roots (an empty pool where the system has
// none to read) with the certificates of bundle added, so that a private
// CA is trusted beside the public ones. A bundle with no certificate is
// refused.
func CertPool(bundle []byte) (*x509.CertPool, error) {
	if err := checkBundle(bundle); err != nil {
		return nil, fmt.Errorf("CA bundle: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	pool.AppendCertsFromPEM(bundle)
	return pool, nil
}

// HTTPTransport returns a clone of http.DefaultTransport that trusts the
// CAs of bundle on top of the system roots; an empty bundle changes
// nothing. There is deliberately no way to skip verification: a private
// CA goes in bundle instead.
func HTTPTransport(bundle []byte) (*http.Transport, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	if len(bundle) == 0 {
		return t, nil
	}
	pool, err := CertPool(bundle)
	if err != nil {
		return nil, err
	}
	t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return t, nil
}

// IsUntrustedCertificate reports whether err says a server's certificate
// was signed by no CA the client trusts. It also reads the message, since
// some clients (go-git) keep the cause's text but not the cause.
func IsUntrustedCertificate(err error) bool {
	if err == nil {
		return false
	}
	var unknown x509.UnknownAuthorityError
	if errors.As(err, &unknown) {
		return true
	}
	return strings.Contains(err.Error(), "certificate signed by unknown authority")
}

// UntrustedCertificateHint is the hint of an untrusted certificate: where
// names the Secret key to put the CA in, e.g. "key ca.crt of Secret
// ns/name (spec.source.git.secretRef)".
func UntrustedCertificateHint(where string) string {
	return "the server's certificate is not signed by a CA Capstan trusts (the system roots plus " + CAKey +
		"): if the server uses a private CA, put the CA's certificate (PEM) in " + where
}

// CAKeyOf names, for hints, key ca.crt of Secret secret
// ("namespace/name") that field (e.g. "spec.source.git.secretRef") names;
// an empty secret says to set field to one.
func CAKeyOf(field, secret string) string {
	if secret == "" {
		return "key " + CAKey + " of a Secret that " + field + " names (set " + field + ")"
	}
	return "key " + CAKey + " of Secret " + secret + " (" + field + ")"
}
