package image

import "time"

// Source is where Capstan's code lives, for the image's source label.
const Source = "https://github.com/capstan-dev/capstan"

// DefaultPlatforms are the platforms `make image` builds.
var DefaultPlatforms = []string{"linux/amd64", "linux/arm64"}

// CapstanOptions are the options `make image` builds Capstan's image with:
// ./cmd/capstan of the module in dir, stamped with version, labelled with
// the version, the revision (a commit) and when that commit was made
// (created, also the image's creation time, so that a commit always gives
// the same image).
func CapstanOptions(dir, version, revision string, created time.Time) Options {
	labels := map[string]string{
		"org.opencontainers.image.title":       "capstan",
		"org.opencontainers.image.description": "Capstan: a pull-based GitOps reconciler for the whole life of a Kubernetes cluster",
		"org.opencontainers.image.source":      Source,
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.revision":    revision,
		"org.opencontainers.image.created":     created.UTC().Format(time.RFC3339),
	}
	return Options{
		Dir:       dir,
		Package:   "./cmd/capstan",
		Binary:    "capstan",
		Platforms: DefaultPlatforms,
		LDFlags:   "-s -w -X main.version=" + version,
		Labels:    labels,
		Created:   created,
	}
}
