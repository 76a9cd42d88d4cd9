package forge

import (
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"
)

// Comment size limits, in bytes (a byte count never undercounts the
// characters forges count).
const (
	// GitHubCommentLimit is GitHub's documented maximum comment body,
	// 65536 characters.
	GitHubCommentLimit = 65536
	// GitLabCommentLimit is GitLab's maximum note, 1,000,000 characters.
	GitLabCommentLimit = 1_000_000
	// GiteaCommentLimit is Capstan's own limit for Gitea, which documents
	// none: the same as GitHub's, since a longer comment is not read.
	GiteaCommentLimit = 65536
)

// cutNote ends a comment truncate cut; cutNoteAtEnd finds it.
const cutNote = "\n\n**Cut:** this comment is %d characters, more than the forge takes (%d); `capstan diff` prints all of it.\n"

var cutNoteAtEnd = regexp.MustCompile(`\n\n\*\*Cut:\*\* this comment is \d+ characters, more than the forge takes \(\d+\); ` +
	"`capstan diff` prints all of it.\n$")

// WasCut reports whether a comment's text ends with the note truncate
// leaves: the forge's size limit cut what followed.
func WasCut(text string) bool {
	return cutNoteAtEnd.MatchString(strings.ReplaceAll(text, "\r\n", "\n"))
}

// truncate cuts text to at most limit bytes, at a line end when one is
// near, closes a code block left open and says that it cut.
func truncate(text string, limit int) string {
	if len(text) <= limit {
		return text
	}
	note := fmt.Sprintf(cutNote, utf8.RuneCountInString(text), limit)
	const fence = "\n```"
	keep := limit - len(note) - len(fence)
	if keep <= 0 {
		return cutBytes(text, limit)
	}
	kept := cutBytes(text, keep)
	if i := strings.LastIndexByte(kept, '\n'); i > len(kept)/2 {
		kept = kept[:i]
	}
	if openFence(kept) {
		kept += fence
	}
	return kept + note
}

// openFence reports whether text ends inside a ``` code block.
func openFence(text string) bool {
	open := false
	for line := range strings.Lines(text) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			open = !open
		}
	}
	return open
}

// cutBytes returns the longest prefix of s of at most n bytes that ends on
// a character boundary.
func cutBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// cutRunes cuts s to n characters, the last one an ellipsis when it cut.
func cutRunes(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}
