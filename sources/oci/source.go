package oci

import (
	"context"
	"crypto"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/Masterminds/semver/v3"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/capstan-dev/capstan/sources"
)

// DefaultTag is the tag a Source follows when Ref is empty.
const DefaultTag = "latest"

// DefaultMaxDownloadBytes is the default Options.MaxDownloadBytes (128 MiB).
const DefaultMaxDownloadBytes = 128 << 20

// maxManifestBytes bounds the manifest Capstan reads; an artifact's
// manifest is a few hundred bytes.
const maxManifestBytes = 4 << 20

// Ref selects which artifact of a repository a Source follows. At most one
// field may be set; none means DefaultTag.
type Ref struct {
	// Tag follows one tag, e.g. "v1.2.3" or "latest".
	Tag string
	// SemVer follows the highest tag that is a semantic version within this
	// range, e.g. ">=1.2.0 <2.0.0" or "~1.4".
	SemVer string
	// Digest pins one manifest, e.g. "sha256:4f2c...".
	Digest string
}

// Options says which repository and artifact a Source follows.
type Options struct {
	// URL of the repository: oci://host[:port]/path. It must carry neither
	// credentials nor a tag or digest (those go in Ref).
	URL string
	// Ref selects the artifact.
	Ref Ref
	// Auth holds the credentials, if the registry needs any.
	Auth Auth
	// Insecure allows plain http to a registry that is not on loopback
	// (loopback registries are always reached over http).
	Insecure bool
	// Limits bound the unpacked artifact and the decompressed layer; zero
	// fields take the defaults of sources.DefaultLimits.
	Limits sources.Limits
	// MaxDownloadBytes bounds the compressed layer; zero means
	// DefaultMaxDownloadBytes.
	MaxDownloadBytes int64
	// CacheDir, when set, is where Fetch writes artifacts, each in a new
	// directory carried in Artifact.Dir, which the caller removes once
	// done with it. Empty keeps artifacts in memory.
	CacheDir string
	// Verify, when set, makes Fetch refuse an artifact without a cosign
	// signature made with one of its keys, before the content is
	// downloaded.
	Verify *Verify
	// Transport is the HTTP transport to use; nil means a clone of
	// http.DefaultTransport that trusts Auth.CABundle. Tests and the CLI
	// leave it nil.
	Transport http.RoundTripper
}

// Source follows one tag, semver range or digest of an OCI repository.
type Source struct {
	repo       name.Repository
	display    string // oci://host/path, for messages
	ref        Ref
	constraint *semver.Constraints
	opts       Options
	limits     UnpackLimits
	maxDown    int64
	verifyKeys []crypto.PublicKey // nil: no verification
	// puller keeps one authenticated transport per repository, so that a
	// poll after the first costs one HEAD request and no token exchange or
	// /v2/ ping.
	puller *remote.Puller
}

var _ sources.Source = (*Source)(nil)

// New checks opts and returns a Source. It does not contact the registry:
// a bad URL, a bad ref or an unusable docker config fail here (wrapping
// sources.ErrInvalid), an unreachable registry only on the first call.
func New(opts Options) (*Source, error) {
	repo, display, err := ParseURL(opts.URL, opts.Insecure)
	if err != nil {
		return nil, err
	}
	s := &Source{repo: repo, display: display, ref: opts.Ref, opts: opts}
	set := 0
	for _, v := range []string{opts.Ref.Tag, opts.Ref.SemVer, opts.Ref.Digest} {
		if v != "" {
			set++
		}
	}
	switch {
	case set > 1:
		return nil, fmt.Errorf("oci source %s: %w: set only one of ref.tag, ref.semver and ref.digest", display, sources.ErrInvalid)
	case opts.Ref.Tag != "":
		if _, err := name.NewTag(repo.Name()+":"+opts.Ref.Tag, name.StrictValidation); err != nil {
			return nil, fmt.Errorf("oci source %s: %w: ref.tag %q is not a valid tag", display, sources.ErrInvalid, opts.Ref.Tag)
		}
	case opts.Ref.SemVer != "":
		if s.constraint, err = semver.NewConstraint(opts.Ref.SemVer); err != nil {
			return nil, fmt.Errorf("oci source %s: %w: ref.semver %q is not a semver range: %w", display, sources.ErrInvalid, opts.Ref.SemVer, err)
		}
	case opts.Ref.Digest != "":
		if _, err := v1.NewHash(opts.Ref.Digest); err != nil {
			return nil, fmt.Errorf("oci source %s: %w: ref.digest %q is not a digest such as sha256:<64 hex digits>", display, sources.ErrInvalid, opts.Ref.Digest)
		}
	default:
		s.ref.Tag = DefaultTag
	}
	keychain, err := opts.Auth.keychain()
	if err != nil {
		return nil, fmt.Errorf("oci source %s: %w", display, err)
	}
	if opts.Verify != nil {
		if s.verifyKeys, err = parseKeys(opts.Verify.PublicKeys); err != nil {
			return nil, fmt.Errorf("oci source %s: %w", display, err)
		}
	}
	s.limits = UnpackLimits{Files: opts.Limits}.withDefaults()
	s.maxDown = opts.MaxDownloadBytes
	if s.maxDown <= 0 {
		s.maxDown = DefaultMaxDownloadBytes
	}
	rt, err := opts.Auth.transport(opts.Transport)
	if err != nil {
		return nil, fmt.Errorf("oci source %s: %w", display, err)
	}
	s.puller, err = remote.NewPuller(remoteOptions(keychain, rt)...)
	if err != nil {
		return nil, fmt.Errorf("oci source %s: %w: %w", display, sources.ErrInvalid, err)
	}
	return s, nil
}

// remoteOptions are the go-containerregistry options every call uses. Its
// retries are off: the reconciler retries with backoff, and a retry inside
// a poll would multiply the requests an unchanged poll costs.
func remoteOptions(keychain authn.Keychain, rt http.RoundTripper) []remote.Option {
	return []remote.Option{
		remote.WithAuthFromKeychain(keychain),
		remote.WithTransport(rt),
		remote.WithUserAgent("capstan"),
		remote.WithRetryPredicate(func(error) bool { return false }),
		remote.WithRetryStatusCodes(),
	}
}

// URL returns the repository URL, fit for messages.
func (s *Source) URL() string { return s.display }

// ParseURL validates an oci:// repository URL and returns the repository
// and the URL as it should appear in messages. Its errors never quote
// credentials.
func ParseURL(raw string, insecure bool) (name.Repository, string, error) {
	if raw == "" {
		return name.Repository{}, "", fmt.Errorf("oci source: %w: URL is empty", sources.ErrInvalid)
	}
	rest, ok := strings.CutPrefix(raw, "oci://")
	if !ok {
		scheme, _, _ := strings.Cut(raw, "://")
		return name.Repository{}, "", fmt.Errorf("oci source: %w: URL must start with oci:// (got scheme %q), e.g. oci://registry.example/clusters/mgmt",
			sources.ErrInvalid, scheme)
	}
	host, _, _ := strings.Cut(rest, "/")
	if strings.Contains(host, "@") {
		return name.Repository{}, "", fmt.Errorf("oci source: %w: the URL holds credentials; put them in spec.source.oci.secretRef instead", sources.ErrInvalid)
	}
	display := "oci://" + rest
	if _, err := url.Parse("https://" + rest); err != nil || strings.ContainsAny(rest, "?#") {
		return name.Repository{}, "", fmt.Errorf("oci source %s: %w: URL does not parse", display, sources.ErrInvalid)
	}
	if !strings.Contains(rest, "/") {
		return name.Repository{}, "", fmt.Errorf("oci source %s: %w: URL has no repository path, e.g. oci://%s/clusters/mgmt", display, sources.ErrInvalid, rest)
	}
	if strings.Contains(strings.TrimPrefix(rest, host), ":") || strings.Contains(rest, "@") {
		return name.Repository{}, "", fmt.Errorf("oci source %s: %w: put the tag or digest in the ref, not in the URL", display, sources.ErrInvalid)
	}
	nopts := []name.Option{name.StrictValidation}
	if insecure {
		nopts = append(nopts, name.Insecure)
	}
	repo, err := name.NewRepository(rest, nopts...)
	if err != nil {
		return name.Repository{}, "", fmt.Errorf("oci source %s: %w: not a repository name (lower case letters, digits, . _ - and / only): %w",
			display, sources.ErrInvalid, err)
	}
	return repo, display, nil
}

// Revision implements sources.Source. For a tag or a digest it is exactly
// one HEAD request of the manifest once the first call has authenticated;
// for a semver range it is one tag listing (paged by the registry) and one
// HEAD of the chosen tag. No manifest or blob is downloaded.
func (s *Source) Revision(ctx context.Context) (string, error) {
	tag, ref, err := s.resolveTag(ctx)
	if err != nil {
		return "", err
	}
	desc, err := s.puller.Head(ctx, ref)
	if err != nil {
		return "", s.classify("check", ref, err)
	}
	return revision(tag, desc.Digest), nil
}

// resolveTag returns the tag to follow ("" when pinned by digest) and the
// reference to ask the registry for. For a semver range it lists the tags.
func (s *Source) resolveTag(ctx context.Context) (string, name.Reference, error) {
	switch {
	case s.ref.Digest != "":
		return "", s.repo.Digest(s.ref.Digest), nil
	case s.constraint != nil:
		tags, err := s.puller.List(ctx, s.repo)
		if err != nil {
			return "", nil, s.classify("list tags of", s.repo, err)
		}
		tag, ok := sources.HighestVersion(tags, s.constraint)
		if !ok {
			return "", nil, s.newError("list tags of", s.repo, sources.ErrNotFound,
				fmt.Sprintf("no tag is a semantic version within %q (the repository has %d tags): push one or change spec.source.oci.ref.semver",
					s.ref.SemVer, len(tags)), nil)
		}
		return tag, s.repo.Tag(tag), nil
	default:
		return s.ref.Tag, s.repo.Tag(s.ref.Tag), nil
	}
}

// revision formats a revision the way every Capstan status shows it:
// "<tag>@sha256:<hex>", or "sha256:<hex>" for a digest pin.
func revision(tag string, digest v1.Hash) string {
	if tag == "" {
		return digest.String()
	}
	return tag + "@" + digest.String()
}

// SetArtifactCache makes Fetch write artifacts into dir, within limits
// (zero fields take their defaults), as Options.CacheDir and
// Options.Limits would have; call it before the first Fetch.
func (s *Source) SetArtifactCache(dir string, limits sources.Limits) {
	s.opts.CacheDir = dir
	s.opts.Limits = limits
	s.limits = UnpackLimits{Files: limits}.withDefaults()
}
