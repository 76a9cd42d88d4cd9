package forge

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capstan-dev/capstan/sources"
)

// DefaultTokenKey is the Secret key ReadCredentials reads the token from
// when given none.
const DefaultTokenKey = "token"

// Credentials is what a forge token Secret holds.
type Credentials struct {
	// Token authenticates every request.
	Token string
	// CABundle is the PEM CA certificates of its ca.crt key (or the older
	// caFile), trusted for the forge's https beside the system roots; nil
	// without one.
	CABundle []byte
	// CAFrom names the Secret's ca.crt key, for the hint of an untrusted
	// certificate.
	CAFrom string
}

// Apply sets cfg's token and CA from c.
func (c Credentials) Apply(cfg Config) Config {
	cfg.Token, cfg.CABundle, cfg.CAFrom = c.Token, c.CABundle, c.CAFrom
	return cfg
}

// ReadCredentials reads a forge token from key of the Secret secret (key
// empty means DefaultTokenKey), and the CA bundle of its ca.crt key.
// Surrounding whitespace, such as the newline of a token written with
// `echo`, is dropped. The error names the Secret and key, never the value.
func ReadCredentials(ctx context.Context, c client.Reader, secret types.NamespacedName, key string) (Credentials, error) {
	if key == "" {
		key = DefaultTokenKey
	}
	s := &corev1.Secret{}
	if err := c.Get(ctx, secret, s); err != nil {
		return Credentials{}, fmt.Errorf("read forge token from Secret %s: %w", secret, err)
	}
	v, ok := s.Data[key]
	if !ok {
		return Credentials{}, fmt.Errorf("read forge token from Secret %s: it has no key %q", secret, key)
	}
	token := strings.TrimSpace(string(v))
	if token == "" {
		return Credentials{}, fmt.Errorf("read forge token from Secret %s: key %q is empty", secret, key)
	}
	ca, err := sources.CABundle(s.Data)
	if err != nil {
		return Credentials{}, fmt.Errorf("read the forge's CA from Secret %s: %w", secret, err)
	}
	return Credentials{Token: token, CABundle: ca, CAFrom: sources.CAKeyOf("spec.report.pullRequests.secretRef", secret.String())}, nil
}
