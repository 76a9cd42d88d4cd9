package image

import (
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func TestPlatform(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    v1.Platform
		wantErr string
	}{
		{in: "linux/amd64", want: v1.Platform{OS: "linux", Architecture: "amd64"}},
		{in: "linux/arm64", want: v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}},
		{in: "linux/arm64/v8", want: v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}},
		{in: "linux/arm/v7", want: v1.Platform{OS: "linux", Architecture: "arm", Variant: "v7"}},
		{in: "", wantErr: `platform "": want os/arch or os/arch/variant`},
		{in: "amd64", wantErr: `platform "amd64": want os/arch`},
		{in: "linux/arm/v7/extra", wantErr: "want os/arch or os/arch/variant"},
		{in: "linux/", wantErr: "empty architecture"},
		{in: "/amd64", wantErr: "empty os"},
		{in: "linux/arm/", wantErr: "empty variant"},
		{in: "linux/ amd64", wantErr: `architecture " amd64" has spaces or commas`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := Platform(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Platform(%q) = %v, %v; want error %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !got.Equals(tc.want) || got.Variant != tc.want.Variant {
				t.Fatalf("Platform(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
		})
	}
}

// FuzzPlatform: what Platform accepts it prints back in a form it parses
// to the same platform.
func FuzzPlatform(f *testing.F) {
	for _, s := range []string{"linux/amd64", "linux/arm64", "linux/arm/v7", "a/b/c/d", "linux//"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := Platform(s)
		if err != nil {
			return
		}
		again, err := Platform(platformString(p))
		if err != nil || !again.Equals(p) {
			t.Fatalf("Platform(%q) = %+v, printed %q parses to %+v, %v", s, p, platformString(p), again, err)
		}
	})
}
