package image

import (
	"fmt"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Platform parses "os/arch[/variant]", as in "linux/amd64" or
// "linux/arm/v7". A linux/arm64 without a variant gets "v8", the variant
// registries and containerd record for it, so that the index entry and the
// image config agree with what a node asks for.
func Platform(s string) (v1.Platform, error) {
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 {
		return v1.Platform{}, fmt.Errorf("platform %q: want os/arch or os/arch/variant, e.g. linux/amd64", s)
	}
	for i, what := range []string{"os", "architecture", "variant"}[:len(parts)] {
		if parts[i] == "" {
			return v1.Platform{}, fmt.Errorf("platform %q: empty %s", s, what)
		}
		if strings.TrimSpace(parts[i]) != parts[i] || strings.ContainsAny(parts[i], " \t\n,") {
			return v1.Platform{}, fmt.Errorf("platform %q: %s %q has spaces or commas", s, what, parts[i])
		}
	}
	p := v1.Platform{OS: parts[0], Architecture: parts[1]}
	switch {
	case len(parts) == 3:
		p.Variant = parts[2]
	case p.Architecture == "arm64":
		p.Variant = "v8"
	}
	return p, nil
}

// platformString is p as Platform parses it back, without an OS version.
func platformString(p v1.Platform) string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}
