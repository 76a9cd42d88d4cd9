package report

import (
	"regexp"
	"slices"
	"strings"
)

// minSecretLen is the shortest Secret value that is scrubbed: shorter ones
// (a user name such as "git") would garble messages and reveal nothing.
const minSecretLen = 6

// minTokenLen is the shortest part of a multi-line or spaced Secret value
// (a kubeconfig, a key) that is scrubbed on its own.
const minTokenLen = 16

// scrubber removes the values of Secrets from text.
type scrubber struct {
	values []string // longest first, so that a value containing another goes whole
}

// add registers the values of one Secret's data: each whole, and each
// line and word of long ones. Keys that hold nothing secret (a user name,
// known_hosts, a CA or public key) are left out, since their values may
// well be words of a status (a user named capstan).
func (s *scrubber) add(data map[string][]byte) {
	for k, v := range data {
		if !public(k) {
			s.addValue(string(v))
		}
	}
}

// public reports whether a Secret key holds a value that is not secret.
func public(key string) bool {
	switch strings.ToLower(key) {
	case "username", "user", "known_hosts", "ca.crt", "cafile", "ca-bundle.crt", "authorized_keys":
		return true
	}
	return strings.HasSuffix(key, ".pub")
}

func (s *scrubber) addValue(v string) {
	v = strings.TrimSpace(v)
	if len(v) >= minSecretLen {
		s.values = append(s.values, v)
	}
	if !strings.ContainsAny(v, " \t\r\n") {
		return
	}
	for _, w := range strings.FieldsFunc(v, func(r rune) bool { return strings.ContainsRune(" \t\r\n\"'", r) }) {
		if len(w) >= minTokenLen {
			s.values = append(s.values, w)
		}
	}
}

// done sorts the values; call it after the last add.
func (s *scrubber) done() {
	slices.SortFunc(s.values, func(a, b string) int { return len(b) - len(a) })
	s.values = slices.Compact(s.values)
}

// userinfo matches the credentials part of a URL.
var userinfo = regexp.MustCompile(`(?i)([a-z][a-z0-9+.-]*://)[^/@\s]+@`)

// clean returns text without any registered value and without URL
// credentials.
func (s *scrubber) clean(text string) string {
	text = userinfo.ReplaceAllString(text, "${1}***@")
	for _, v := range s.values {
		if strings.Contains(text, v) {
			text = strings.ReplaceAll(text, v, "***")
		}
	}
	return text
}

// cleanFile replaces any registered value left in a rendered file (one
// in a field clean did not see, such as a stage name) by a word that keeps
// the YAML valid wherever it stands.
func (s *scrubber) cleanFile(data []byte) []byte {
	for _, v := range s.values {
		if strings.Contains(string(data), v) {
			data = []byte(strings.ReplaceAll(string(data), v, "REDACTED"))
		}
	}
	return data
}
