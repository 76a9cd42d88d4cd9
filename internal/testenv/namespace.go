package testenv

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// maxNamespacePrefix leaves room for the five random characters the API
// server appends within the 63 characters of a namespace name.
const maxNamespacePrefix = 40

// CreateNamespace creates a namespace whose generated name starts with
// prefix and returns the name. The prefix is made a valid DNS label first,
// so a test can pass t.Name().
func (e *Env) CreateNamespace(ctx context.Context, prefix string) (string, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: namespacePrefix(prefix)}}
	created, err := e.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("create namespace %s*: %w", ns.GenerateName, err)
	}
	return created.Name, nil
}

// namespacePrefix lowercases prefix, replaces what a DNS label may not hold
// with '-', shortens it and ends it with '-'.
func namespacePrefix(prefix string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(prefix) {
		if b.Len() >= maxNamespacePrefix {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
	}
	s := strings.TrimSuffix(b.String(), "-")
	if s == "" {
		s = "test"
	}
	return s + "-"
}
