package main

import "strings"

// shortHashDigits is how many digits of a hash a short revision keeps, as
// Flux shows them.
const shortHashDigits = 8

// formatRevision shortens a revision for people: "main@sha1:1a2b3c4d",
// "v1.2.3@sha256:1a2b3c4d", "sha1:1a2b3c4d" (a pinned commit). What
// follows the last "<algorithm>:" is cut to shortHashDigits; a revision
// without one is returned as it is. Every command that prints a revision
// in a table uses it.
func formatRevision(rev string) string {
	for _, algo := range []string{"sha1:", "sha256:"} {
		i := strings.LastIndex(rev, algo)
		if i < 0 || (i > 0 && rev[i-1] != '@') {
			continue
		}
		if start := i + len(algo); len(rev) > start+shortHashDigits {
			return rev[:start+shortHashDigits]
		}
	}
	return rev
}
