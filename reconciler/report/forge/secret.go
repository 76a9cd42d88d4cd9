package forge

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// DefaultTokenKey is the Secret key ReadToken reads when given none.
const DefaultTokenKey = "token"

// ReadToken reads a forge token from key of the Secret secret (key empty
// means DefaultTokenKey). Surrounding whitespace, such as the newline of a
// token written with `echo`, is dropped. The error names the Secret and
// key, never the value.
func ReadToken(ctx context.Context, c client.Reader, secret types.NamespacedName, key string) (string, error) {
	if key == "" {
		key = DefaultTokenKey
	}
	s := &corev1.Secret{}
	if err := c.Get(ctx, secret, s); err != nil {
		return "", fmt.Errorf("read forge token from Secret %s: %w", secret, err)
	}
	v, ok := s.Data[key]
	if !ok {
		return "", fmt.Errorf("read forge token from Secret %s: it has no key %q", secret, key)
	}
	token := strings.TrimSpace(string(v))
	if token == "" {
		return "", fmt.Errorf("read forge token from Secret %s: key %q is empty", secret, key)
	}
	return token, nil
}
