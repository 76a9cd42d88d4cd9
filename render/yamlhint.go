package render

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
)

// yamlLineRE finds the line a YAML syntax error names.
var yamlLineRE = regexp.MustCompile(`\byaml: line (\d+):`)

// flowSubstitutionRE finds a ${VAR} left bare inside a flow mapping or
// sequence: after an opening brace or bracket, and not inside quotes.
// There the braces of ${VAR} are YAML's own flow indicators, so the file
// is not YAML before substitution runs, though it would be after.
var flowSubstitutionRE = regexp.MustCompile(`[{\[][^"'#]*?[:,\[{]\s*[^"'\s,{}\[\]]*\$\{`)

// substitutionHint adds to a YAML syntax error in data the likely cause
// when a line near the one it names puts ${VAR} bare in a flow mapping
// ({host: ${X}}): which line, and to quote the value or use block style.
// It only adds words: the error stays the parser's (errors.Is and As
// find it).
// Other errors are returned as they are.
func substitutionHint(data []byte, err error) error {
	lines := bytes.Split(data, []byte("\n"))
	// The parser names the line it stopped at, which may be the one
	// after the flow mapping, or the one before when it counts from 0.
	// Some errors name no line (an unclosed flow list): then the first
	// line that fits is the likely one.
	var near []int
	if m := yamlLineRE.FindStringSubmatch(err.Error()); m != nil {
		if n, convErr := strconv.Atoi(m[1]); convErr == nil {
			near = []int{n, n + 1, n - 1}
		}
	} else {
		for i := range lines {
			near = append(near, i+1)
		}
	}
	for _, at := range near {
		if at < 1 || at > len(lines) {
			continue
		}
		if flowSubstitutionRE.Match(lines[at-1]) {
			return fmt.Errorf("%w (line %d puts ${VAR} inside a flow mapping or list, which is not YAML before substitution: quote the value, as \"${VAR}\", or write the mapping in block style)", err, at)
		}
	}
	return err
}
