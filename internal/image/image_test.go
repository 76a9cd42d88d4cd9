package image

import (
	"bytes"
	"context"
	"io"
	"log"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// helloPlatforms are the platforms the test image is built for.
var helloPlatforms = []string{"linux/amd64", "linux/arm64/v8"}

// helloCreated is the test image's creation time.
var helloCreated = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// helloOptions build testdata/hello, a tiny static program.
func helloOptions() Options {
	return Options{
		Dir:       ".",
		Package:   "./testdata/hello",
		Binary:    "hello",
		Platforms: helloPlatforms,
		LDFlags:   "-X main.version=test-1",
		Labels:    map[string]string{LabelSource: "https://example.com/hello", LabelVersion: "test-1"},
		// Sub-second parts are dropped, so the digest moves only by the second.
		Created: helloCreated.Add(300 * time.Millisecond),
	}
}

// helloWant is what every platform's hello image must be.
var helloWant = expectation{
	binary:  "hello",
	labels:  map[string]string{LabelSource: "https://example.com/hello", LabelVersion: "test-1"},
	created: helloCreated,
	output:  "hello test-1 linux/",
}

var hello struct {
	once sync.Once
	idx  v1.ImageIndex
	err  error
}

// helloIndex builds the test image once for the package's tests.
func helloIndex(t *testing.T) v1.ImageIndex {
	t.Helper()
	hello.once.Do(func() { hello.idx, hello.err = Build(context.Background(), helloOptions()) })
	if hello.err != nil {
		t.Fatal(hello.err)
	}
	return hello.idx
}

func TestBuildWritesAnImportableOCITarball(t *testing.T) {
	idx := helloIndex(t)
	const ref = "registry.example:5000/capstan/hello:test-1"
	out := filepath.Join(t.TempDir(), "out", "hello.tar")
	if err := WriteOCITarball(out, idx, ref); err != nil {
		t.Fatal(err)
	}
	desc, read := readOCITarball(t, out)
	for k, v := range map[string]string{AnnotationContainerdName: ref, AnnotationRefName: "test-1"} {
		if desc.Annotations[k] != v {
			t.Errorf("index.json annotation %s = %q, want %q", k, desc.Annotations[k], v)
		}
	}
	want, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest != want {
		t.Errorf("index.json entry %s, want the built index %s", desc.Digest, want)
	}
	checkImages(t, helloWant, []string{"linux/amd64", "linux/arm64/v8"}, unpackIndex(t, read))
}

func TestBuildIsDeterministic(t *testing.T) {
	first := helloIndex(t)
	second, err := Build(context.Background(), helloOptions())
	if err != nil {
		t.Fatal(err)
	}
	d1, err := first.Digest()
	if err != nil {
		t.Fatal(err)
	}
	d2, err := second.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if d1 != d2 {
		t.Errorf("two builds of the same source: index %s, then %s", d1, d2)
	}
	var tars [2][]byte
	for i, idx := range []v1.ImageIndex{first, second} {
		path := filepath.Join(t.TempDir(), "hello.tar")
		if err := WriteOCITarball(path, idx, "capstan.dev/hello:1"); err != nil {
			t.Fatal(err)
		}
		if tars[i], err = os.ReadFile(path); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(tars[0], tars[1]) {
		t.Error("two OCI tarballs of the same index differ")
	}

	opts := helloOptions()
	opts.Created = helloCreated.Add(time.Second)
	later, err := Build(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if d3, err := later.Digest(); err != nil || d3 == d1 {
		t.Errorf("a build created a second later has the same digest %s (%v)", d3, err)
	}
}

func TestBuildProgress(t *testing.T) {
	opts := helloOptions()
	var progress bytes.Buffer
	opts.Progress = &progress
	if _, err := Build(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(progress.String()), "\n")
	want := []string{
		"image: building ./testdata/hello for linux/amd64",
		"image: packed linux/amd64: layer ",
		"image: building ./testdata/hello for linux/arm64/v8",
		"image: packed linux/arm64/v8: layer ",
	}
	if len(lines) != len(want) {
		t.Fatalf("progress:\n%s\nwant %d lines", progress.String(), len(want))
	}
	for i := range want {
		if !strings.HasPrefix(lines[i], want[i]) {
			t.Errorf("progress line %d: %q, want it to start with %q", i, lines[i], want[i])
		}
	}
}

func TestBuildRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Options)
		want []string
	}{
		{"no package", func(o *Options) { o.Package = "" }, []string{"empty Package"}},
		{"a binary name with a slash", func(o *Options) { o.Binary = "bin/hello" }, []string{`binary "bin/hello": want a file name`}},
		{"no platforms", func(o *Options) { o.Platforms = nil }, []string{"empty Platforms"}},
		{"a platform that is not os/arch", func(o *Options) { o.Platforms = []string{"amd64"} }, []string{`platform "amd64": want os/arch`}},
		{"a windows image", func(o *Options) { o.Platforms = []string{"windows/amd64"} }, []string{`platform "windows/amd64": only linux images`}},
		{"arm64 twice, with and without its variant", func(o *Options) { o.Platforms = []string{"linux/arm64", "linux/arm64/v8"} }, []string{`platform "linux/arm64/v8": listed twice`}},
		{"every problem at once", func(o *Options) { o.Package, o.Binary, o.Platforms = "", "", []string{"linux"} }, []string{"empty Package", `binary ""`, `platform "linux"`}},
		{"no CA certificates", func(o *Options) { o.CABundle = filepath.Join(t.TempDir(), "missing.crt") }, []string{"read CA certificates (Debian: apt-get install ca-certificates)", "missing.crt: no such file"}},
		{"a package that does not build", func(o *Options) { o.Package = "./testdata/missing" }, []string{"go build ./testdata/missing for linux/amd64"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := helloOptions()
			tc.edit(&opts)
			_, err := Build(context.Background(), opts)
			if err == nil {
				t.Fatal("built")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q, want it to say %q", err, w)
				}
			}
		})
	}
}

func TestPushToLoopbackRegistry(t *testing.T) {
	idx := helloIndex(t)
	want, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	// Plain http: go-containerregistry falls back to it for these hosts only.
	for _, host := range []string{"127.0.0.1", "localhost"} {
		t.Run(host, func(t *testing.T) {
			ref := host + ":" + port + "/capstan/hello:test-1"
			if err := Push(context.Background(), idx, ref); err != nil {
				t.Fatal(err)
			}
			pulled, err := remote.Index(mustRef(t, ref), remote.WithContext(context.Background()))
			if err != nil {
				t.Fatal(err)
			}
			got, err := pulled.Digest()
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("pulled index %s, pushed %s", got, want)
			}
			checkImages(t, helloWant, []string{"linux/amd64", "linux/arm64/v8"}, unpackIndex(t, pulled))
		})
	}
}

func TestPushRefusesAnUntaggedReference(t *testing.T) {
	err := Push(context.Background(), helloIndex(t), "127.0.0.1:1/capstan")
	if err == nil || !strings.Contains(err.Error(), "push image") {
		t.Errorf("push to an untagged reference: %v, want an error", err)
	}
}

func TestDescribe(t *testing.T) {
	images, err := Describe(helloIndex(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(images) != 2 {
		t.Fatalf("%d images, want 2", len(images))
	}
	for i, img := range images {
		if platformString(img.Platform) != helloPlatforms[i] {
			t.Errorf("image %d for %s, want %s", i, platformString(img.Platform), helloPlatforms[i])
		}
		// A Go binary is more than 1 MiB and gzip shrinks it.
		if img.Compressed <= 0 || img.Uncompressed < 1<<20 || img.Compressed >= img.Uncompressed {
			t.Errorf("%s: %d bytes compressed, %d unpacked", img, img.Compressed, img.Uncompressed)
		}
		if !strings.HasPrefix(img.String(), helloPlatforms[i]+" ") || !strings.Contains(img.String(), " MiB unpacked)") {
			t.Errorf("String() = %q", img)
		}
	}
}

// mustRef parses a reference the test wrote.
func mustRef(t *testing.T, ref string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
