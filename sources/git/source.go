package git

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/go-git/go-git/v5/plumbing/transport"

	"github.com/capstan-dev/capstan/sources"
)

// DefaultBranch is the branch a Source follows when neither Options.Branch
// nor Options.Ref says otherwise.
const DefaultBranch = "main"

// Options says which repository and which branch, tag or commit of it a
// Source follows.
type Options struct {
	// URL of the repository: https://, http://, ssh://, git://, file:// or
	// the scp-like user@host:path. It must not carry a password.
	URL string
	// Branch to follow: the same as Ref.Branch, kept for the callers that
	// only ever follow a branch (the root source).
	Branch string
	// Ref selects what to follow; none of its fields (and no Branch) means
	// DefaultBranch.
	Ref Ref
	// Auth holds the credentials, if the remote needs any.
	Auth Auth
	// Limits bound the fetched artifact; zero fields take the defaults of
	// sources.DefaultLimits. MaxFileBytes bounds every file of the
	// repository, read or not: go-git inflates each object of the pack
	// whole while it indexes it.
	Limits sources.Limits
	// CacheDir, when set, is where Fetch writes artifacts (each in a new
	// directory, carried in Artifact.Dir) and its temporary clones; the
	// caller removes an artifact's directory once done with it. Empty
	// keeps artifacts in memory and clones in os.TempDir().
	CacheDir string
	// Verify, when set, makes Fetch refuse a head commit that is not
	// signed by one of its keys.
	Verify *Verify
	// CredentialsFrom names where Auth's credentials are set, for the
	// hints of authentication errors; zero fields name the keys of
	// spec.source.git.secretRef.
	CredentialsFrom CredentialsFrom
}

// CredentialsFrom names, for people, where each kind of credential of a
// source is set: a field of a deployment's Secret, or a flag of the daemon
// for its root source.
type CredentialsFrom struct {
	// HTTP is where the https user name and password (or token) are set.
	HTTP string
	// SSHKey is where the ssh private key is set.
	SSHKey string
	// KnownHosts is where the server's ssh host keys are set.
	KnownHosts string
	// CA is where the CAs to trust for https are set.
	CA string
}

// withDefaults fills the zero fields with the keys of
// spec.source.git.secretRef.
func (c CredentialsFrom) withDefaults() CredentialsFrom {
	if c.HTTP == "" {
		c.HTTP = "username and password (or a token) in spec.source.git.secretRef"
	}
	if c.SSHKey == "" {
		c.SSHKey = "identity in spec.source.git.secretRef"
	}
	if c.KnownHosts == "" {
		c.KnownHosts = "known_hosts in spec.source.git.secretRef"
	}
	if c.CA == "" {
		c.CA = sources.CAKeyOf("spec.source.git.secretRef", "")
	}
	return c
}

// Auth holds credentials for a remote, as read from a deployment's
// secretRef. Fields that do not apply to the URL's scheme are ignored, so
// one secret can serve an https and an ssh URL alike.
type Auth struct {
	// Username for HTTP basic auth. When only Password is set (a token),
	// "git" is sent as the user name, which the common hosts accept.
	Username string
	// Password or token for HTTP basic auth.
	Password string
	// CABundle is extra PEM certificates to trust for https, on top of the
	// system pool (the ca.crt key of a Secret, AuthFromSecret). There is
	// no option to skip verification: a private CA goes here.
	CABundle []byte
	// SSHPrivateKey is an unencrypted PEM private key (OpenSSH, PKCS#1,
	// PKCS#8) for ssh URLs. Required for ssh.
	SSHPrivateKey []byte
	// SSHKnownHosts holds known_hosts lines for the server; required for
	// ssh, since Capstan never accepts an unknown host key.
	SSHKnownHosts []byte
	// SSHUser overrides the user name of ssh URLs; without it the URL's
	// user is used, or "git".
	SSHUser string
}

// Source follows one branch, tag, semver range, commit or ref of one git
// repository.
type Source struct {
	url     string // as given, for go-git
	display string // without user info, for messages
	scheme  string
	ref     followedRef
	auth    transport.AuthMethod
	opts    Options
	limits  sources.Limits
	verify  *verifier // nil: commits are not verified
	creds   CredentialsFrom
}

var _ sources.Source = (*Source)(nil)

// New checks opts and returns a Source. It does not contact the remote:
// a bad URL, a missing ssh key or known_hosts fail here (wrapping
// sources.ErrInvalid), an unreachable server only on the first call.
func New(opts Options) (*Source, error) {
	ep, display, err := parseURL(opts.URL)
	if err != nil {
		return nil, err
	}
	s := &Source{
		url:     opts.URL,
		display: display,
		scheme:  ep.Protocol,
		opts:    opts,
		limits:  opts.Limits.WithDefaults(),
		creds:   opts.CredentialsFrom.withDefaults(),
	}
	ref := opts.Ref
	if opts.Branch != "" {
		if ref.Branch != "" && ref.Branch != opts.Branch {
			return nil, fmt.Errorf("git source %s: %w: Branch %q and Ref.Branch %q differ", display, sources.ErrInvalid, opts.Branch, ref.Branch)
		}
		ref.Branch = opts.Branch
	}
	if s.ref, err = parseRef(ref); err != nil {
		return nil, fmt.Errorf("git source %s: %w", display, err)
	}
	if s.auth, err = authMethod(ep, opts.Auth, s.creds); err != nil {
		return nil, fmt.Errorf("git source %s: %w", display, err)
	}
	if len(opts.Auth.CABundle) > 0 {
		// go-git drops what does not parse without a word.
		if _, err := sources.CertPool(opts.Auth.CABundle); err != nil {
			return nil, fmt.Errorf("git source %s: %w: %s: %w", display, sources.ErrInvalid, s.creds.CA, err)
		}
	}
	if opts.Verify != nil {
		if s.verify, err = newVerifier(opts.Verify); err != nil {
			return nil, fmt.Errorf("git source %s: %w", display, err)
		}
	}
	return s, nil
}

// URL returns the repository URL without user info, fit for messages.
func (s *Source) URL() string { return s.display }

// Branch returns the branch the Source follows, or "" when it follows a
// tag, a semver range, a commit or a ref name.
func (s *Source) Branch() string {
	if s.ref.kind != refBranch {
		return ""
	}
	return s.ref.value
}

// Ref returns what the Source follows, for messages: "branch main",
// "tag v1.2.3", "semver >=1.0.0", "commit <sha>" or "ref refs/pull/7/head".
func (s *Source) Ref() string { return s.ref.String() }

// parseURL validates a repository URL and returns its endpoint and a form
// of it without user info. Its errors never quote a password.
func parseURL(raw string) (*transport.Endpoint, string, error) {
	if raw == "" {
		return nil, "", fmt.Errorf("git source: %w: URL is empty", sources.ErrInvalid)
	}
	display := raw
	if scheme, _, ok := strings.Cut(raw, "://"); ok {
		u, err := url.Parse(raw)
		if err != nil {
			// url.Parse quotes the whole URL, password included.
			return nil, "", fmt.Errorf("git source: %w: URL with scheme %q does not parse", sources.ErrInvalid, scheme)
		}
		if _, hasPassword := u.User.Password(); hasPassword {
			u.User = nil
			return nil, "", fmt.Errorf("git source %s: %w: the URL holds a password; put credentials in spec.source.git.secretRef instead",
				u.String(), sources.ErrInvalid)
		}
		u.User = nil
		display = u.String()
		switch u.Scheme {
		case "http", "https", "ssh", "git", "file":
		default:
			return nil, "", fmt.Errorf("git source %s: %w: unsupported scheme %q; use https, http, ssh, git or file",
				display, sources.ErrInvalid, u.Scheme)
		}
		if u.Scheme != "file" && u.Host == "" {
			return nil, "", fmt.Errorf("git source %s: %w: URL has no host", display, sources.ErrInvalid)
		}
		if u.Scheme == "file" && u.Path == "" {
			return nil, "", fmt.Errorf("git source %s: %w: file URL has no path", display, sources.ErrInvalid)
		}
	}
	ep, err := transport.NewEndpoint(raw)
	if err != nil {
		return nil, "", fmt.Errorf("git source %s: %w: URL does not parse", display, sources.ErrInvalid)
	}
	if ep.Protocol == "file" && !strings.HasPrefix(raw, "file://") {
		return nil, "", fmt.Errorf("git source %s: %w: not a URL; write file://%s for a local repository or user@host:path for ssh",
			display, sources.ErrInvalid, raw)
	}
	if ep.Password != "" || strings.Contains(ep.User, ":") {
		return nil, "", fmt.Errorf("git source %s:%s: %w: the URL holds a password; put credentials in spec.source.git.secretRef instead",
			ep.Host, ep.Path, sources.ErrInvalid)
	}
	return ep, display, nil
}

// SetArtifactCache makes Fetch write artifacts and clones into dir, within
// limits (zero fields take their defaults), as Options.CacheDir and
// Options.Limits would have. It is for a Source made elsewhere (the
// daemon's root source); call it before the first Fetch.
func (s *Source) SetArtifactCache(dir string, limits sources.Limits) {
	s.opts.CacheDir = dir
	s.opts.Limits = limits
	s.limits = limits.WithDefaults()
}
