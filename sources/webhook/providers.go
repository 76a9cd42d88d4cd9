package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// event is what a provider's payload says, reduced to what Capstan needs.
type event struct {
	urls   []string // the repository's URLs, as the payload gives them
	branch string
	pong   bool   // a ping: answer 200, trigger nothing
	ignore string // authentic, but nothing to fetch: why
}

// provider is one kind of sender.
type provider struct {
	name   string
	secret func(Options) []byte
	verify func(h http.Header, body, secret []byte) error
	parse  func(h http.Header, body []byte) (event, error)
}

var providers = map[string]provider{
	"github": {
		name:   "GitHub",
		secret: func(o Options) []byte { return o.GitHubSecret },
		verify: func(h http.Header, body, secret []byte) error {
			return verifyHMAC("X-Hub-Signature-256", "sha256=", h, body, secret)
		},
		parse: func(h http.Header, body []byte) (event, error) {
			switch ev := h.Get("X-GitHub-Event"); ev {
			case "ping":
				return event{pong: true}, nil
			case "push":
				return parsePush(body)
			default:
				return event{ignore: fmt.Sprintf("event %q is not a push", ev)}, nil
			}
		},
	},
	"gitea": {
		name:   "Gitea",
		secret: func(o Options) []byte { return o.GiteaSecret },
		verify: func(h http.Header, body, secret []byte) error {
			return verifyHMAC("X-Gitea-Signature", "", h, body, secret)
		},
		parse: func(h http.Header, body []byte) (event, error) {
			if ev := h.Get("X-Gitea-Event"); ev != "push" {
				return event{ignore: fmt.Sprintf("event %q is not a push", ev)}, nil
			}
			return parsePush(body)
		},
	},
	"gitlab": {
		name:   "GitLab",
		secret: func(o Options) []byte { return o.GitLabToken },
		verify: func(h http.Header, _, secret []byte) error {
			return verifyToken("X-Gitlab-Token", h.Get("X-Gitlab-Token"), secret)
		},
		parse: func(h http.Header, body []byte) (event, error) {
			if ev := h.Get("X-Gitlab-Event"); ev != "Push Hook" {
				return event{ignore: fmt.Sprintf("event %q is not a Push Hook", ev)}, nil
			}
			return parsePush(body)
		},
	},
	"generic": {
		name:   "generic",
		secret: func(o Options) []byte { return o.GenericToken },
		verify: func(h http.Header, _, secret []byte) error {
			token, ok := strings.CutPrefix(h.Get("Authorization"), "Bearer ")
			if !ok {
				return errors.New("missing Authorization: Bearer <token> header")
			}
			return verifyToken("bearer token", token, secret)
		},
		parse: parseGeneric,
	},
}

// verifyHMAC checks that header holds prefix + hex(HMAC-SHA256(secret,
// body)), in constant time.
func verifyHMAC(header, prefix string, h http.Header, body, secret []byte) error {
	got := h.Get(header)
	if got == "" {
		return fmt.Errorf("missing %s header", header)
	}
	sig, ok := strings.CutPrefix(got, prefix)
	if !ok {
		return fmt.Errorf("%s header does not start with %q", header, prefix)
	}
	raw, err := hex.DecodeString(sig)
	if err != nil {
		return fmt.Errorf("%s header is not hex", header)
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	if !hmac.Equal(raw, mac.Sum(nil)) {
		return fmt.Errorf("%s does not match the body: check the webhook secret", header)
	}
	return nil
}

// verifyToken compares a token in constant time.
func verifyToken(what, got string, secret []byte) error {
	if got == "" {
		return fmt.Errorf("missing %s", what)
	}
	if subtle.ConstantTimeCompare([]byte(got), secret) != 1 {
		return fmt.Errorf("wrong %s: check the webhook secret", what)
	}
	return nil
}

// pushPayload is the part of a GitHub, Gitea or GitLab push payload
// Capstan reads. GitHub and Gitea describe the repository under
// "repository"; GitLab under "project" (and, older, "repository").
type pushPayload struct {
	Ref        string     `json:"ref"`
	After      string     `json:"after"`
	Deleted    bool       `json:"deleted"`
	Repository repoFields `json:"repository"`
	Project    repoFields `json:"project"`
}

type repoFields struct {
	CloneURL   string `json:"clone_url"`
	SSHURL     string `json:"ssh_url"`
	GitURL     string `json:"git_url"`
	HTMLURL    string `json:"html_url"`
	GitHTTPURL string `json:"git_http_url"`
	GitSSHURL  string `json:"git_ssh_url"`
	WebURL     string `json:"web_url"`
	Homepage   string `json:"homepage"`
}

func (r repoFields) urls() []string {
	var out []string
	for _, u := range []string{r.CloneURL, r.GitHTTPURL, r.SSHURL, r.GitSSHURL, r.GitURL, r.HTMLURL, r.WebURL, r.Homepage} {
		if u != "" {
			out = append(out, u)
		}
	}
	return out
}

// zeroCommit is the "after" of a push that deleted the ref.
const zeroCommit = "0000000000000000000000000000000000000000"

func parsePush(body []byte) (event, error) {
	var p pushPayload
	if err := json.Unmarshal(body, &p); err != nil {
		return event{}, fmt.Errorf("push payload is not JSON (set the webhook's content type to application/json): %w", err)
	}
	urls := append(p.Repository.urls(), p.Project.urls()...)
	if len(urls) == 0 {
		return event{}, errors.New("push payload names no repository URL")
	}
	if p.Ref == "" {
		return event{}, errors.New("push payload has no ref")
	}
	branch, ok := strings.CutPrefix(p.Ref, "refs/heads/")
	switch {
	case !ok:
		return event{ignore: fmt.Sprintf("ref %s is not a branch", p.Ref)}, nil
	case p.Deleted || p.After == zeroCommit:
		return event{ignore: "branch " + branch + " was deleted"}, nil
	}
	return event{urls: urls, branch: branch}, nil
}

// genericPayload is the body of the generic endpoint.
type genericPayload struct {
	URL    string `json:"url"`
	Branch string `json:"branch"`
}

func parseGeneric(_ http.Header, body []byte) (event, error) {
	var p genericPayload
	if err := json.Unmarshal(body, &p); err != nil {
		return event{}, fmt.Errorf(`body must be JSON {"url": "<repository or oci:// URL>", "branch": "<branch, optional>"}: %w`, err)
	}
	if p.URL == "" {
		return event{}, errors.New(`body has no "url"`)
	}
	return event{urls: []string{p.URL}, branch: strings.TrimPrefix(p.Branch, "refs/heads/")}, nil
}
