package sources

import (
	"errors"
	"io/fs"
	"testing"

	"github.com/Masterminds/semver/v3"

	"github.com/capstan-dev/capstan/failure"
)

// An operation's error reads subject, policy word, hint, cause; keeps the
// sentinel and the cause reachable; and never carries a secret.
func TestOpError(t *testing.T) {
	cause := errors.New("server said: bad password hunter22: \n")
	err := OpError("list refs https://git.example/r.git branch main", ErrAuth, "check the Secret", cause, "hunter22", "abc")
	want := "list refs https://git.example/r.git branch main: authentication failed: check the Secret: server said: bad password [redacted]"
	if err.Error() != want {
		t.Errorf("message\n got %q\nwant %q", err.Error(), want)
	}
	if !errors.Is(err, ErrAuth) || !errors.Is(err, cause) {
		t.Errorf("errors.Is lost the sentinel or the cause: %v", err)
	}
	if f, ok := failure.From(err); !ok || f.Reason != ReasonAuthenticationFailed || f.Policy != failure.PolicyStalled {
		t.Errorf("failure.From = %+v; want %s, stalled", f, ReasonAuthenticationFailed)
	}
	// No sentinel: transient; a short secret is left alone (it would
	// match ordinary words).
	err = OpError("fetch oci://r/x", nil, "", fs.ErrNotExist, "abc")
	if err.Error() != "fetch oci://r/x: file does not exist" || !errors.Is(err, fs.ErrNotExist) || IsStalled(err) {
		t.Errorf("plain error = %q (stalled %v)", err, IsStalled(err))
	}
}

func TestHighestVersion(t *testing.T) {
	cases := []struct {
		name       string
		constraint string
		tags       []string
		want       string
	}{
		{"the highest within the range", ">=1.0.0 <2.0.0", []string{"v1.0.0", "v1.4.2", "v2.0.0", "v1.10.0"}, "v1.10.0"},
		{"tags that are not versions are skipped", ">=1.0.0", []string{"latest", "main", "v1.2.0"}, "v1.2.0"},
		{"of two spellings of one version, the one sorting last", ">=1.0.0", []string{"v1.2.0", "1.2.0"}, "v1.2.0"},
		{"the same whatever the listing order", ">=1.0.0", []string{"1.2.0", "v1.2.0"}, "v1.2.0"},
		{"none within the range", ">=3.0.0", []string{"v1.0.0", "v2.0.0"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			con, err := semver.NewConstraint(c.constraint)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := HighestVersion(c.tags, con)
			if got != c.want || ok != (c.want != "") {
				t.Errorf("HighestVersion(%q, %q) = %q, %v; want %q", c.tags, c.constraint, got, ok, c.want)
			}
		})
	}
}
