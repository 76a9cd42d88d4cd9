package main

import (
	"strings"
	"testing"
)

func TestFormatRevisionKeepsTheRefAndEightDigits(t *testing.T) {
	sha1, sha256 := strings.Repeat("1a2b3c4d5e", 4), strings.Repeat("abcdef0123456789", 4)
	for rev, want := range map[string]string{
		"main@sha1:" + sha1:             "main@sha1:1a2b3c4d",
		"v1.2.3@sha1:" + sha1:           "v1.2.3@sha1:1a2b3c4d",
		"refs/pull/7/head@sha1:" + sha1: "refs/pull/7/head@sha1:1a2b3c4d",
		"sha1:" + sha1:                  "sha1:1a2b3c4d",
		"v1@sha256:" + sha256:           "v1@sha256:abcdef01",
		"sha256:" + sha256:              "sha256:abcdef01",
		"main@sha1:1a2b":                "main@sha1:1a2b",
		"":                              "",
		"sha1-in-a-branch@sha1:" + sha1: "sha1-in-a-branch@sha1:1a2b3c4d",
	} {
		if got := formatRevision(rev); got != want {
			t.Errorf("formatRevision(%q) = %q, want %q", rev, got, want)
		}
	}
}
