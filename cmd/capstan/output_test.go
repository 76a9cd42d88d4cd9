package main

import (
	"bytes"
	"slices"
	"testing"
)

// Off a terminal the width is --width, else $COLUMNS, else 80.
func TestOutputWidthOffATerminal(t *testing.T) {
	var pipe bytes.Buffer
	for _, tc := range []struct {
		name    string
		columns string
		flag    int
		want    int
	}{
		{"nothing says: 80", "", 0, defaultWidth},
		{"$COLUMNS", "132", 0, 132},
		{"--width beats $COLUMNS", "132", 200, 200},
		{"$COLUMNS that is not a number is ignored", "wide", 0, defaultWidth},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("COLUMNS", tc.columns)
			if got := outputWidth(&pipe, tc.flag); got != tc.want {
				t.Errorf("width = %d, want %d", got, tc.want)
			}
		})
	}
	if v := (&outputFlags{output: outputWide, noHeaders: true}).view(&pipe); v.color || !v.wide || !v.noHeaders {
		t.Errorf("view to a pipe = %+v, want no colour, wide, no headers", v)
	}
}

func TestWrapBreaksAtSpacesAndInsideLongWords(t *testing.T) {
	for _, tc := range []struct {
		text  string
		width int
		want  []string
	}{
		{"waiting for status.ready of Widget/ns/a", 20, []string{"waiting for", "status.ready of", "Widget/ns/a"}},
		{"Metal3Cluster/capstan-system/mgmt-east", 16, []string{"Metal3Cluster/ca", "pstan-system/mgm", "t-east"}},
		{"", 10, []string{""}},
	} {
		if got := wrap(tc.text, tc.width); !slices.Equal(got, tc.want) {
			t.Errorf("wrap(%q, %d) = %q, want %q", tc.text, tc.width, got, tc.want)
		}
	}
}
