package oci

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/capstan-dev/capstan/sources"
)

// Auth holds the credentials for a registry, as read from a deployment's
// secretRef. With nothing set the registry is read anonymously.
type Auth struct {
	// DockerConfig is the content of a docker config file (the
	// `.dockerconfigjson` key of a kubernetes.io/dockerconfigjson Secret):
	// credentials per registry host under "auths". Credential helpers
	// (credsStore, credHelpers) are not run: a daemon must not execute
	// programs named by a Secret.
	DockerConfig []byte
	// Keychain, when set, is used instead of DockerConfig. The CLI sets
	// authn.DefaultKeychain, which reads the user's own docker config and
	// may run its credential helpers.
	Keychain authn.Keychain
	// CABundle is PEM certificates of CAs to trust for the registry's
	// https, on top of the system roots (the ca.crt key of the Secret,
	// sources.CABundle). There is no option to skip verification: a
	// private CA goes here.
	CABundle []byte
	// CAFrom names where CABundle is set, for the hint of an untrusted
	// certificate; empty names ca.crt of spec.source.oci.secretRef.
	CAFrom string
}

// keychain returns the keychain a's credentials describe.
func (a Auth) keychain() (authn.Keychain, error) {
	if a.Keychain != nil {
		return a.Keychain, nil
	}
	if len(a.DockerConfig) == 0 {
		return staticKeychain{}, nil
	}
	return ParseDockerConfig(a.DockerConfig)
}

// dockerConfig is the part of a docker config file Capstan reads.
type dockerConfig struct {
	Auths       map[string]dockerAuth `json:"auths"`
	CredsStore  string                `json:"credsStore"`
	CredHelpers map[string]string     `json:"credHelpers"`
}

type dockerAuth struct {
	Auth          string `json:"auth"`
	Username      string `json:"username"`
	Password      string `json:"password"`
	IdentityToken string `json:"identitytoken"`
	RegistryToken string `json:"registrytoken"`
}

// staticKeychain maps registry hosts to credentials; any other host is
// read anonymously.
type staticKeychain map[string]authn.AuthConfig

// ParseDockerConfig reads the "auths" of a docker config file into a
// keychain. Its errors wrap sources.ErrInvalid and never quote a
// credential.
func ParseDockerConfig(data []byte) (authn.Keychain, error) {
	var cfg dockerConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		// json's syntax errors quote no input, only offsets.
		return nil, fmt.Errorf("%w: docker config is not valid JSON: %w", sources.ErrInvalid, err)
	}
	if len(cfg.Auths) == 0 {
		if cfg.CredsStore != "" || len(cfg.CredHelpers) > 0 {
			return nil, fmt.Errorf("%w: docker config names credential helpers, which Capstan does not run; put the registry's credentials under \"auths\" (docker login writes them there with no credsStore set)",
				sources.ErrInvalid)
		}
		return nil, fmt.Errorf("%w: docker config has no \"auths\"", sources.ErrInvalid)
	}
	kc := staticKeychain{}
	for key, a := range cfg.Auths {
		host := registryHost(key)
		ac := authn.AuthConfig{
			Username:      a.Username,
			Password:      a.Password,
			IdentityToken: a.IdentityToken,
			RegistryToken: a.RegistryToken,
		}
		if a.Auth != "" {
			raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(a.Auth))
			if err != nil {
				return nil, fmt.Errorf("%w: docker config: auths[%q].auth is not base64", sources.ErrInvalid, key)
			}
			user, pass, ok := strings.Cut(string(raw), ":")
			if !ok {
				return nil, fmt.Errorf("%w: docker config: auths[%q].auth is not base64 of user:password", sources.ErrInvalid, key)
			}
			ac.Username, ac.Password = user, pass
		}
		if ac == (authn.AuthConfig{}) {
			return nil, fmt.Errorf("%w: docker config: auths[%q] holds no credentials", sources.ErrInvalid, key)
		}
		kc[host] = ac
	}
	return kc, nil
}

// Resolve implements authn.Keychain.
func (k staticKeychain) Resolve(target authn.Resource) (authn.Authenticator, error) {
	host := strings.ToLower(target.RegistryStr())
	candidates := []string{host}
	if host == "index.docker.io" {
		candidates = append(candidates, "docker.io", "registry-1.docker.io")
	}
	for _, h := range candidates {
		if ac, ok := k[h]; ok {
			return authn.FromConfig(ac), nil
		}
	}
	return authn.Anonymous, nil
}

// registryHost turns a key of "auths" ("https://index.docker.io/v1/",
// "registry.example:5000") into the host go-containerregistry asks for.
func registryHost(key string) string {
	key = strings.ToLower(strings.TrimSpace(key))
	key = strings.TrimPrefix(strings.TrimPrefix(key, "https://"), "http://")
	host, _, _ := strings.Cut(key, "/")
	return host
}

// transport returns rt, or when nil a clone of http.DefaultTransport that
// trusts a's CABundle beside the system roots, with a bound on the wait
// for an answer.
func (a Auth) transport(rt http.RoundTripper) (http.RoundTripper, error) {
	if rt != nil {
		return rt, nil
	}
	t, err := sources.HTTPTransport(a.CABundle)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", sources.ErrInvalid, a.caFrom(), err)
	}
	t.ResponseHeaderTimeout = 30 * time.Second
	return t, nil
}

func (a Auth) caFrom() string {
	if a.CAFrom == "" {
		return sources.CAKeyOf("spec.source.oci.secretRef", "")
	}
	return a.CAFrom
}

// hasCredentials reports whether the keychain could send credentials at
// all, for the hint an authentication failure gets.
func (a Auth) hasCredentials() bool {
	return a.Keychain != nil || len(a.DockerConfig) > 0
}
