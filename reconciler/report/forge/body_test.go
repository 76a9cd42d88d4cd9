package forge

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		text  string
		limit int
		check func(t *testing.T, got string)
	}{
		{"text within the limit is left alone", "short plan", 100, func(t *testing.T, got string) {
			if got != "short plan" {
				t.Errorf("got %q", got)
			}
		}},
		{"a long text is cut at a line end with a note", strings.Repeat("line of the plan\n", 500), 2000, func(t *testing.T, got string) {
			if !strings.Contains(got, "**Cut:** this comment is 8500 characters") || !strings.Contains(got, "`capstan diff`") {
				t.Errorf("no cut note in %q", got[max(0, len(got)-200):])
			}
			before, _, _ := strings.Cut(got, "\n\n**Cut:**")
			if !strings.HasSuffix(before, "line of the plan") {
				t.Errorf("not cut at a line end: ...%q", before[max(0, len(before)-40):])
			}
		}},
		{"an open code block is closed", "```diff\n" + strings.Repeat("+ a\n", 1000), 1000, func(t *testing.T, got string) {
			if strings.Count(got, "```")%2 != 0 {
				t.Errorf("unbalanced code fences in %q", got)
			}
		}},
		{"multi-byte characters are never split", strings.Repeat("ä", 3000), 1001, func(t *testing.T, got string) {
			if !utf8.ValidString(got) {
				t.Error("invalid UTF-8")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := truncate(tc.text, tc.limit)
			if len(got) > tc.limit {
				t.Errorf("%d bytes, over the limit %d", len(got), tc.limit)
			}
			tc.check(t, got)
		})
	}
}

func TestMarkerOwnership(t *testing.T) {
	for _, tc := range []struct {
		text string
		ours bool
	}{
		{Marker("plan") + "\nthe plan", true},
		{Marker("plan") + "\r\nthe plan", true},
		{Marker("plan"), true},
		{"> " + Marker("plan") + "\n> quoted by a reviewer", false},
		{"I think " + Marker("plan") + " is wrong", false},
		{Marker("plan/other") + "\nanother deployment's comment", false},
		{Marker("plans") + "\n", false},
	} {
		if got := isOurs(tc.text, "plan"); got != tc.ours {
			t.Errorf("isOurs(%q) = %v, want %v", tc.text, got, tc.ours)
		}
	}
}

func TestMarkerKeyCannotCloseTheComment(t *testing.T) {
	for _, key := range []string{"", "plan -->", "plan\nx", "<script>", strings.Repeat("a", 201)} {
		if err := checkKey(key); err == nil {
			t.Errorf("key %q accepted", key)
		}
	}
	for _, key := range []string{"plan", "plan/clusters/workload-a", "capstan.dev:rollout"} {
		if err := checkKey(key); err != nil {
			t.Errorf("key %q: %v", key, err)
		}
	}
}

func TestStatusDescriptionIsOneShortLine(t *testing.T) {
	got := statusDescription(Status{Description: "stage workers\nwaiting   for " + strings.Repeat("MachineDeployment ", 20)})
	if strings.Contains(got, "\n") || utf8.RuneCountInString(got) > MaxStatusDescription || !strings.HasSuffix(got, "…") {
		t.Errorf("description %q: want one line of at most %d characters ending in an ellipsis", got, MaxStatusDescription)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Provider: "bitbucket", Token: "x"}, "must be one of github, gitea, gitlab"},
		{Config{Provider: ProviderGitea, Token: "x"}, "a base URL is required"},
		{Config{Provider: ProviderGitHub}, "a token is required"},
		{Config{Provider: ProviderGitHub, Token: "x", BaseURL: "github.example.com"}, "must be an http(s) URL"},
		{Config{Provider: ProviderGitLab, Token: "x", BaseURL: "ftp://gitlab.example.com"}, "must be an http(s) URL"},
	} {
		_, err := New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", tc.cfg, err, tc.want)
		}
	}
}
