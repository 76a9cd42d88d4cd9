package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/mitchellh/go-wordwrap"
	"github.com/spf13/pflag"
	"golang.org/x/term"
	"sigs.k8s.io/yaml"
)

// defaultWidth is how wide tables are when stdout is not a terminal and
// neither --width nor $COLUMNS says otherwise.
const defaultWidth = 80

// Output formats of status, get and events.
const (
	outputTable = ""
	outputWide  = "wide"
	outputYAML  = "yaml"
	outputJSON  = "json"
)

// outputFlags are the output flags status, get and events share.
type outputFlags struct {
	output    string
	noHeaders bool
	width     int
}

// BindFlags binds the flags; wide says what -o wide adds.
func (f *outputFlags) BindFlags(fs *pflag.FlagSet, wide string) {
	fs.StringVarP(&f.output, "output", "o", "", "output format: wide ("+wide+"), yaml or json")
	fs.BoolVar(&f.noHeaders, "no-headers", false, "print no header line above a table")
	fs.IntVar(&f.width, "width", 0, "width of the output in columns (default: the terminal's, else $COLUMNS, else 80)")
}

func (f *outputFlags) validate() error {
	switch f.output {
	case outputTable, outputWide, outputYAML, outputJSON:
	default:
		return fmt.Errorf("--output %q: expected wide, yaml or json", f.output)
	}
	if f.width < 0 {
		return fmt.Errorf("--width %d: must be positive", f.width)
	}
	return nil
}

// structured tells whether the output is for scripts (yaml or json).
func (f *outputFlags) structured() bool {
	return f.output == outputYAML || f.output == outputJSON
}

// view is how human output to out is drawn: as wide as the flag, the
// terminal or $COLUMNS say, in colour only on a terminal (and never with
// NO_COLOR set or TERM=dumb).
func (f *outputFlags) view(out io.Writer) view {
	v := view{width: outputWidth(out, f.width), wide: f.output == outputWide, noHeaders: f.noHeaders}
	if isTerminal(out) {
		v.color = os.Getenv("NO_COLOR") == "" && os.Getenv("TERM") != "dumb"
	}
	return v
}

func isTerminal(out io.Writer) bool {
	file, ok := out.(*os.File)
	return ok && term.IsTerminal(int(file.Fd()))
}

// outputWidth is flag when set, else the terminal's width when out is
// one, else $COLUMNS, else defaultWidth. A terminal narrower than
// minWidth gets minWidth: its lines wrap.
func outputWidth(out io.Writer, flag int) int {
	if flag > 0 {
		return flag
	}
	if file, ok := out.(*os.File); ok && term.IsTerminal(int(file.Fd())) {
		if w, _, err := term.GetSize(int(file.Fd())); err == nil && w > 0 {
			return max(w, minWidth)
		}
	}
	if w, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && w > 0 {
		return w
	}
	return defaultWidth
}

// encode prints v as yaml or json, for scripts; json without HTML
// escaping, so that ranges such as ">=1.0.0" stay readable.
func encode(v any, format string) ([]byte, error) {
	if format == outputYAML {
		return yaml.Marshal(v)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	err := enc.Encode(v)
	return b.Bytes(), err
}

// wrap breaks s into lines of at most w runes, at spaces where it can,
// inside a word longer than w where it must.
func wrap(s string, w int) []string {
	if w <= 0 {
		return []string{""}
	}
	var out []string
	for _, line := range strings.Split(wordwrap.WrapString(s, uint(w)), "\n") {
		r := []rune(line)
		for len(r) > w {
			out = append(out, string(r[:w]))
			r = r[w:]
		}
		out = append(out, string(r))
	}
	return out
}
