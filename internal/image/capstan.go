package image

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// The OCI annotation keys Capstan's image is labelled with
// (https://github.com/opencontainers/image-spec/blob/main/annotations.md).
const (
	// LabelTitle is the image's name for humans.
	LabelTitle = "org.opencontainers.image.title"
	// LabelDescription says what the image is.
	LabelDescription = "org.opencontainers.image.description"
	// LabelSource is the URL of the source repository.
	LabelSource = "org.opencontainers.image.source"
	// LabelRevision is the commit the image was built from.
	LabelRevision = "org.opencontainers.image.revision"
	// LabelVersion is the version stamped into the binary.
	LabelVersion = "org.opencontainers.image.version"
	// LabelCreated is Options.Created in RFC 3339; Build sets it.
	LabelCreated = "org.opencontainers.image.created"
)

// Source is where Capstan's code lives: the default LabelSource.
const Source = "https://github.com/capstan-dev/capstan"

// DefaultPlatforms are the platforms `make image` builds by default.
var DefaultPlatforms = []string{"linux/amd64", "linux/arm64"}

// CapstanOptions are the options `make image` builds Capstan's image with:
// ./cmd/capstan of the module in the current directory, stamped with
// version as `make build` does (and stripped of debug symbols), labelled
// with the version, the revision (a commit; may be empty) and Source, for
// DefaultPlatforms. Callers set Dir when not at the module root, and
// Created to the revision's commit time (CommitTime) for an image that only
// depends on the commit.
func CapstanOptions(version, revision string) Options {
	labels := map[string]string{
		LabelTitle:       "capstan",
		LabelDescription: "Capstan: a pull-based GitOps reconciler for the whole life of a Kubernetes cluster",
		LabelSource:      Source,
		LabelVersion:     version,
	}
	if revision != "" {
		labels[LabelRevision] = revision
	}
	return Options{
		Dir:       ".",
		Package:   "./cmd/capstan",
		Binary:    "capstan",
		Platforms: append([]string(nil), DefaultPlatforms...),
		LDFlags:   "-s -w -X main.version=" + version,
		Labels:    labels,
	}
}

// CommitTime is the committer time of revision in the git repository at
// dir: the creation time that makes an image reproducible from its commit.
func CommitTime(ctx context.Context, dir, revision string) (time.Time, error) {
	cmd := exec.CommandContext(ctx, "git", "show", "-s", "--format=%ct", revision, "--")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		if exit := (*exec.ExitError)(nil); errors.As(err, &exit) {
			return time.Time{}, fmt.Errorf("commit time of %s: %w: %s", revision, err, strings.TrimSpace(string(exit.Stderr)))
		}
		return time.Time{}, fmt.Errorf("commit time of %s: %w", revision, err)
	}
	sec, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("commit time of %s: %w", revision, err)
	}
	return time.Unix(sec, 0).UTC(), nil
}
