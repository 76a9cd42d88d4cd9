package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// The limit flags of `capstan run` take byte counts the way the errors
// that name them print them.
func TestLimitFlagsTakeByteCounts(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  string
	}{
		{in: "1048576", want: 1 << 20},
		{in: "8MiB", want: 8 << 20},
		{in: "8Mi", want: 8 << 20},
		{in: "512KiB", want: 512 << 10},
		{in: "2GiB", want: 2 << 30},
		{in: "100B", want: 100},
		{in: "8M", err: "unknown unit"},
		{in: "0", err: "positive number"},
		{in: "-1MiB", err: "positive number"},
		{in: "lots", err: "positive number"},
		{in: "9999999TiB", err: "too large"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			var f limitFlags
			fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
			f.BindFlags(fs)
			err := fs.Parse([]string{"--max-file-bytes=" + tc.in})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want an error containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if f.opts.MaxFileBytes != tc.want {
				t.Errorf("--max-file-bytes=%s gave %d, want %d", tc.in, f.opts.MaxFileBytes, tc.want)
			}
			if got := fs.Lookup("max-file-bytes").Value.String(); mustParse(t, got) != tc.want {
				t.Errorf("the flag prints %q, which does not read back as %d", got, tc.want)
			}
		})
	}
}

func mustParse(t *testing.T, s string) int64 {
	t.Helper()
	n, err := parseBytes(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A --default-service-account that cannot name a ServiceAccount is
// refused before the daemon starts, saying what a name must be.
func TestRunRefusesABadDefaultServiceAccount(t *testing.T) {
	_, err := runCapstan(t, "run", "--default-service-account", "Team_A")
	if err == nil || !strings.Contains(err.Error(), `--default-service-account "Team_A" is not a ServiceAccount name`) {
		t.Fatalf("capstan run --default-service-account Team_A: %v, want the name refused", err)
	}
}
