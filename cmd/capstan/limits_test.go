package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/capstan-dev/capstan/internal/testca"
	"github.com/capstan-dev/capstan/reconciler"
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

// --source-ca-file gives the root source the CAs to trust for https; a
// file that holds no certificate is refused before the daemon starts,
// naming the flag and the file.
func TestRootSourceCAFile(t *testing.T) {
	ca := testca.Must(t, "root source CA")
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(good, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := rootFlags{url: "https://git.example.com/fleet.git", caFile: good}
	opts, err := f.options(reconciler.ArtifactOptions{})
	if err != nil || !bytes.Equal(opts.Auth.CABundle, ca.PEM) {
		t.Fatalf("--source-ca-file %s: CA bundle %q, %v; want the file's certificate", good, opts.Auth.CABundle, err)
	}
	f.caFile = bad
	if _, err := f.options(reconciler.ArtifactOptions{}); err == nil || !strings.Contains(err.Error(), "--source-ca-file "+bad) ||
		!strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("--source-ca-file with no certificate: %v, want it refused naming the flag, the file and what it lacks", err)
	}

	// Installed, the PEM comes from Secret capstan-secrets through the
	// environment.
	f.caFile = ""
	t.Setenv(sourceCAEnv, string(ca.PEM))
	if opts, err := f.options(reconciler.ArtifactOptions{}); err != nil || !bytes.Equal(opts.Auth.CABundle, ca.PEM) {
		t.Errorf("$%s: CA bundle %q, %v; want its certificate", sourceCAEnv, opts.Auth.CABundle, err)
	}
	t.Setenv(sourceCAEnv, "not a certificate")
	if _, err := f.options(reconciler.ArtifactOptions{}); err == nil || !strings.Contains(err.Error(), "$"+sourceCAEnv) {
		t.Errorf("$%s with no certificate: %v, want it refused naming the variable", sourceCAEnv, err)
	}
}

// --root-source-namespaces lists namespaces whose deployments without a
// source read the root source; a name that cannot be a namespace, or the
// flag without a root source, is refused before the daemon starts.
func TestRootSourceNamespacesFlag(t *testing.T) {
	_, err := runCapstan(t, "run", "--source", "https://git.example.com/fleet.git", "--root-source-namespaces", "team-a,Team_B")
	if err == nil || !strings.Contains(err.Error(), `--root-source-namespaces: "Team_B" is not a namespace name`) {
		t.Errorf("capstan run --root-source-namespaces team-a,Team_B: %v, want Team_B refused", err)
	}
	_, err = runCapstan(t, "run", "--root-source-namespaces", "team-a")
	if err == nil || !strings.Contains(err.Error(), "no root source") {
		t.Errorf("capstan run --root-source-namespaces without --source: %v, want it refused", err)
	}
	f := rootFlags{url: "https://git.example.com/fleet.git", namespaces: []string{"team-a", "team-b"}}
	opts, err := f.options(reconciler.ArtifactOptions{})
	if err != nil || !slices.Equal(opts.Namespaces, []string{"team-a", "team-b"}) {
		t.Errorf("root options: namespaces %v, %v; want team-a and team-b", opts.Namespaces, err)
	}
}
