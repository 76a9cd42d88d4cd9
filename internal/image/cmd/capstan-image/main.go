// Command capstan-image builds Capstan's container image without Docker
// (`make image`) and points the install manifests at a released image
// (`make set-image`):
//
//	capstan-image build --ref REPO:TAG --version V --revision SHA [--out FILE] [--push]
//	capstan-image set-image --ref REPO:TAG [--kustomization manifests/kustomization.yaml]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/internal/image"
	"github.com/capstan-dev/capstan/manifests"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "capstan-image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("want a command: build or set-image")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	switch args[0] {
	case "build":
		return build(ctx, args[1:])
	case "set-image":
		return setImage(args[1:])
	default:
		return fmt.Errorf("unknown command %q: want build or set-image", args[0])
	}
}

func build(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	ref := fs.String("ref", "ghcr.io/capstan-dev/capstan:latest", "image reference: the tarball's name and where --push pushes")
	out := fs.String("out", "bin/capstan-image.tar", "OCI layout tarball to write")
	version := fs.String("version", "devel", "version stamped into the binary and labelled")
	revision := fs.String("revision", "", "commit labelled as the source revision; its commit time becomes the image's creation time")
	platforms := fs.String("platforms", strings.Join(image.DefaultPlatforms, ","), "comma-separated os/arch list")
	push := fs.Bool("push", false, "push the image to --ref")
	if err := fs.Parse(args); err != nil {
		return err
	}
	created, err := commitTime(ctx, *revision)
	if err != nil {
		return err
	}
	opts := image.CapstanOptions(".", *version, *revision, created)
	opts.Platforms = strings.Split(*platforms, ",")
	opts.Progress = os.Stdout
	idx, err := image.Build(ctx, opts)
	if err != nil {
		return err
	}
	if err := image.WriteOCITarball(*out, idx, *ref); err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	size, err := os.Stat(*out)
	if err != nil {
		return err
	}
	fmt.Printf("image: %s %s, %.1f MiB, written to %s\n", *ref, digest, float64(size.Size())/(1<<20), *out)
	if *push {
		d, err := image.Push(ctx, idx, *ref)
		if err != nil {
			return err
		}
		fmt.Printf("image: pushed %s\n", d)
	}
	return nil
}

// commitTime is the commit time of revision, or the Unix epoch without one.
func commitTime(ctx context.Context, revision string) (time.Time, error) {
	if revision == "" {
		return time.Unix(0, 0), nil
	}
	out, err := exec.CommandContext(ctx, "git", "show", "-s", "--format=%ct", revision).Output()
	if err != nil {
		return time.Time{}, fmt.Errorf("commit time of %s: %w", revision, err)
	}
	sec, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("commit time of %s: %w", revision, err)
	}
	return time.Unix(sec, 0), nil
}

func setImage(args []string) error {
	fs := flag.NewFlagSet("set-image", flag.ContinueOnError)
	ref := fs.String("ref", "", "image reference, REPO:TAG or REPO@DIGEST")
	file := fs.String("kustomization", "manifests/kustomization.yaml", "kustomization file to edit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *ref == "" {
		return errors.New("set-image: --ref is required")
	}
	if err := image.SetKustomizeImage(*file, manifests.ImageName, *ref); err != nil {
		return err
	}
	fmt.Printf("image: %s now installs %s\n", *file, *ref)
	return nil
}
