package image

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestCapstanImage is the acceptance test of `make image`: Capstan's image
// built with CapstanOptions, as the command does, for this machine's
// platform, and read back from its OCI tarball. Compiling Capstan takes
// minutes on a cold build cache, so -short skips it.
func TestCapstanImage(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: cross-compiling ./cmd/capstan for two platforms takes minutes on a cold cache")
	}
	const (
		version  = "v0.0.0-imagetest"
		revision = "0123456789abcdef0123456789abcdef01234567"
		ref      = "ghcr.io/capstan-dev/capstan:" + version
	)
	created := time.Date(2026, 11, 25, 4, 28, 50, 0, time.UTC)
	opts := CapstanOptions(version, revision)
	// Capstan for this machine's platform only. An index of several
	// platforms is what the hello image's tests prove, through the same
	// Build; a cold cross-compile of Capstan's whole dependency tree for
	// a second architecture cost minutes of every fresh `make test`.
	// `make image` still builds DefaultPlatforms.
	platform, indexed := hostPlatform()
	opts.Platforms = []string{platform}
	opts.Dir = filepath.Join("..", "..")
	opts.Created = created
	begin := time.Now()
	idx, err := Build(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	built := time.Since(begin)
	out := filepath.Join(t.TempDir(), "capstan-image.tar")
	if err := WriteOCITarball(out, idx, ref); err != nil {
		t.Fatal(err)
	}
	desc, read := readOCITarball(t, out)
	if desc.Annotations[AnnotationContainerdName] != ref {
		t.Errorf("index.json names the image %q, want %q", desc.Annotations[AnnotationContainerdName], ref)
	}
	checkImages(t, expectation{
		binary: "capstan",
		labels: map[string]string{
			LabelTitle:    "capstan",
			LabelSource:   "https://github.com/capstan-dev/capstan",
			LabelVersion:  version,
			LabelRevision: revision,
		},
		created: created,
		run:     []string{"version"},
		output:  "capstan " + version + " linux/" + runtime.GOARCH,
	}, []string{indexed}, unpackIndex(t, read))

	images, err := Describe(idx)
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built in %s; tarball %s; %v", built.Round(time.Second), MiB(info.Size()), images)
}

// hostPlatform is this machine's platform as Options take it and as the
// index names it.
func hostPlatform() (option, indexed string) {
	if runtime.GOARCH == "arm64" {
		return "linux/arm64", "linux/arm64/v8"
	}
	return "linux/" + runtime.GOARCH, "linux/" + runtime.GOARCH
}

func TestCapstanOptions(t *testing.T) {
	opts := CapstanOptions("v1.2.3", "")
	if opts.Package != "./cmd/capstan" || opts.Binary != "capstan" || opts.Dir != "." {
		t.Errorf("builds %s in %q as %s, want ./cmd/capstan in . as capstan", opts.Package, opts.Dir, opts.Binary)
	}
	if !strings.Contains(opts.LDFlags, "-X main.version=v1.2.3") {
		t.Errorf("ldflags %q do not stamp the version", opts.LDFlags)
	}
	if _, ok := opts.Labels[LabelRevision]; ok {
		t.Errorf("labels %v: a revision label without a revision", opts.Labels)
	}
	opts.Platforms[0] = "linux/s390x"
	if DefaultPlatforms[0] != "linux/amd64" {
		t.Error("editing the options' platforms changed DefaultPlatforms")
	}
}

func TestCommitTime(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	dir := t.TempDir()
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"}, args...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_DATE=2001-02-03T04:05:06Z", "GIT_COMMITTER_DATE=2021-02-03T04:05:06Z")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("init", "-q")
	git("commit", "-q", "--allow-empty", "-m", "one")
	head := git("rev-parse", "HEAD")

	got, err := CommitTime(context.Background(), dir, head)
	if want := time.Date(2021, 2, 3, 4, 5, 6, 0, time.UTC); err != nil || !got.Equal(want) {
		t.Errorf("CommitTime(HEAD) = %s, %v; want the committer time %s", got, err, want)
	}
	if _, err := CommitTime(context.Background(), dir, "no-such-revision"); err == nil || !strings.Contains(err.Error(), "commit time of no-such-revision") {
		t.Errorf("CommitTime of a missing revision: %v, want an error naming it", err)
	}
}
