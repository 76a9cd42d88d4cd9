// Package testca makes a private certificate authority and serving
// certificates signed by it, for tests of https servers whose CA the
// system does not trust (a company CA): the test serves TLS with
// ServerTLS and gives the client PEM.
package testca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"
	"time"
)

// CA is a self-signed certificate authority, valid for a day.
type CA struct {
	// PEM is the CA's certificate, what a client puts in ca.crt.
	PEM  []byte
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// New makes a CA named name.
func New(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	return &CA{PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert: cert, key: key}, nil
}

// ServerCertificate returns a serving certificate for 127.0.0.1, ::1 and
// localhost signed by the CA.
func (c *CA) ServerCertificate() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate serving key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    c.cert.NotBefore,
		NotAfter:     c.cert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("create serving certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// ServerTLS returns a server TLS config that serves a certificate from
// ServerCertificate.
func (c *CA) ServerTLS() (*tls.Config, error) {
	cert, err := c.ServerCertificate()
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		// crypto/rand does not fail on the systems Go supports.
		panic(err)
	}
	return n
}

// Serve serves h over https on 127.0.0.1 with a certificate of the CA, as
// a server behind a company CA is reached. Handshakes of clients that do
// not trust the CA fail, as tests mean them to, without a log line each.
func (c *CA) Serve(h http.Handler) (*httptest.Server, error) {
	cfg, err := c.ServerTLS()
	if err != nil {
		return nil, err
	}
	s := httptest.NewUnstartedServer(h)
	s.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.TLS = cfg
	s.StartTLS()
	return s, nil
}

// Proxy serves the http(s) server at target through a reverse proxy over
// https with a certificate of the CA: a real server (a forge, a registry)
// behind a private CA.
func (c *CA) Proxy(target string) (*httptest.Server, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("proxy target %q: %w", target, err)
	}
	return c.Serve(&httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(u) }})
}

// Must is New for a test: a CA named name, or the test fails.
func Must(t testing.TB, name string) *CA {
	t.Helper()
	c, err := New(name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// ProxyFor is Proxy for a test: the proxy stops when the test ends, and
// an error fails the test.
func (c *CA) ProxyFor(t testing.TB, target string) *httptest.Server {
	t.Helper()
	s, err := c.Proxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}
