// Command capstan-image builds Capstan's container image without Docker
// (`make image`) and points the install manifests at a released image
// (`make set-image`):
//
//	capstan-image build --ref REPO:TAG --version V --revision SHA [--source URL]
//	    [--platforms linux/amd64,linux/arm64] [--out bin/capstan-image.tar] [--push]
//	capstan-image set-image --ref REPO:TAG|REPO@DIGEST
//	    [--kustomization manifests/kustomization.yaml] [--name capstan]
//
// It runs from the module root.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"github.com/spf13/pflag"

	"github.com/capstan-dev/capstan/internal/image"
	"github.com/capstan-dev/capstan/manifests"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "capstan-image:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	args := os.Args[1:]
	if len(args) == 0 {
		return errors.New("want a command: build or set-image")
	}
	switch args[0] {
	case "build":
		var f buildFlags
		if err := parse("build", args[1:], f.BindFlags); err != nil {
			return err
		}
		return build(ctx, f, os.Stdout)
	case "set-image":
		var f setImageFlags
		if err := parse("set-image", args[1:], f.BindFlags); err != nil {
			return err
		}
		return setImage(f, os.Stdout)
	default:
		return fmt.Errorf("unknown command %q: want build or set-image", args[0])
	}
}

// parse parses a command's flags; positional arguments are refused.
func parse(command string, args []string, bind func(*pflag.FlagSet)) error {
	fs := pflag.NewFlagSet(command, pflag.ContinueOnError)
	bind(fs)
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%s: %w", command, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected arguments %q", command, fs.Args())
	}
	return nil
}

// buildFlags are the flags of `capstan-image build`.
type buildFlags struct {
	ref, out, version, revision, source, platforms, goCmd string
	push                                                  bool
}

// BindFlags registers the build flags on fs.
func (f *buildFlags) BindFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.ref, "ref", "", "image reference REPO:TAG: the tarball's name and where --push pushes (required)")
	fs.StringVar(&f.out, "out", "bin/capstan-image.tar", "OCI layout tarball to write")
	fs.StringVar(&f.version, "version", "devel", "version stamped into the binary and labelled")
	fs.StringVar(&f.revision, "revision", "", "commit labelled as the source revision; its commit time becomes the image's creation time (empty: the Unix epoch)")
	fs.StringVar(&f.source, "source", image.Source, "source repository URL labelled")
	fs.StringVar(&f.platforms, "platforms", strings.Join(image.DefaultPlatforms, ","), "comma-separated os/arch[/variant] list")
	fs.StringVar(&f.goCmd, "go", "go", "go command to build with")
	fs.BoolVar(&f.push, "push", false, "also push the image to --ref")
}

// build builds Capstan's image with image.CapstanOptions, writes the
// tarball and pushes it when asked.
func build(ctx context.Context, f buildFlags, stdout io.Writer) error {
	if f.ref == "" {
		return errors.New("build: --ref is required")
	}
	opts := image.CapstanOptions(f.version, f.revision)
	opts.Labels[image.LabelSource] = f.source
	opts.Platforms = strings.Split(f.platforms, ",")
	opts.Go = f.goCmd
	opts.Progress = stdout
	if f.revision != "" {
		created, err := image.CommitTime(ctx, ".", f.revision)
		if err != nil {
			return fmt.Errorf("build: %w", err)
		}
		opts.Created = created
	}
	idx, err := image.Build(ctx, opts)
	if err != nil {
		return err
	}
	if err := image.WriteOCITarball(f.out, idx, f.ref); err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return fmt.Errorf("build: index digest: %w", err)
	}
	platforms, err := image.Describe(idx)
	if err != nil {
		return err
	}
	info, err := os.Stat(f.out)
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	sizes := make([]string, len(platforms))
	for i, p := range platforms {
		sizes[i] = p.String()
	}
	fmt.Fprintf(stdout, "image: %s@%s: %s\n", f.ref, digest, strings.Join(sizes, ", "))
	done := "wrote " + f.out + " (" + image.MiB(info.Size()) + ")"
	if f.push {
		if err := image.Push(ctx, idx, f.ref); err != nil {
			return err
		}
		done += ", pushed " + f.ref
	}
	fmt.Fprintln(stdout, "image:", done)
	return nil
}

// setImageFlags are the flags of `capstan-image set-image`.
type setImageFlags struct {
	kustomization, name, ref string
}

// BindFlags registers the set-image flags on fs.
func (f *setImageFlags) BindFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.kustomization, "kustomization", "manifests/kustomization.yaml", "kustomization file to edit")
	fs.StringVar(&f.name, "name", manifests.ImageName, "name of the images entry, the image the manifests refer to")
	fs.StringVar(&f.ref, "ref", "", "image reference REPO:TAG or REPO@DIGEST (required)")
}

// setImage points the kustomization's image entry at f.ref.
func setImage(f setImageFlags, stdout io.Writer) error {
	if f.ref == "" {
		return errors.New("set-image: --ref is required")
	}
	if err := image.SetKustomizeImage(f.kustomization, f.name, f.ref); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "image: %s: images[name=%s] now %s\n", f.kustomization, f.name, f.ref)
	return nil
}
