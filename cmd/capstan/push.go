package main

import (
	"fmt"
	"io/fs"
	"os"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/capstan-dev/capstan/sources/dir"
	"github.com/capstan-dev/capstan/sources/oci"
)

// pushArtifactFlags say what to pack and where to push it.
type pushArtifactFlags struct {
	path         string
	tag          string
	dockerConfig string
	insecure     bool
	source       string
	revision     string
}

func (f *pushArtifactFlags) BindFlags(flags *pflag.FlagSet) {
	flags.StringVar(&f.path, "path", ".", "directory to pack; its symlinks must stay inside it")
	flags.StringVar(&f.tag, "tag", oci.DefaultTag, "tag to push")
	flags.StringVar(&f.dockerConfig, "docker-config", "", "docker config file with the registry's credentials under \"auths\" (default: your docker login, helpers included)")
	flags.BoolVar(&f.insecure, "insecure", false, "use plain http for a registry that is not on loopback")
	flags.StringVar(&f.source, "source", "", "annotate the artifact with the URL its content came from ("+oci.AnnotationSource+")")
	flags.StringVar(&f.revision, "revision", "", "annotate the artifact with the revision its content came from, e.g. main@sha1:<commit> ("+oci.AnnotationRevision+")")
}

func newPushCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "push",
		Short: "Push cluster definitions to a registry",
	}
	cmd.AddCommand(newPushArtifactCommand())
	return cmd
}

func newPushArtifactCommand() *cobra.Command {
	var f pushArtifactFlags
	cmd := &cobra.Command{
		Use:   "artifact oci://HOST/REPOSITORY",
		Short: "Pack a directory as an OCI artifact (Flux format) and push it",
		Long: `Push artifact packs the files of a directory into a gzip-compressed tar and
pushes it as an OCI artifact in the format of "flux push artifact", which a
ClusterDeployment with spec.source.oci reads. Symlinks inside the directory
are packed as copies of their targets; one that leaves the directory, a
device file or a pipe is refused, as the daemon would refuse them. A .git
directory is left out.

The tar is reproducible, so pushing the same content twice gives the same
digest and no deployment sees a new revision. It prints the revision
deployments following the tag will report.`,
		Example: `  capstan push artifact oci://registry.example/clusters/mgmt --path ./clusters --tag v1.4.0
  capstan push artifact oci://127.0.0.1:5000/clusters --path examples --tag latest \
      --source https://git.example/infra.git --revision main@sha1:4f2c...`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.run(cmd, args[0])
		},
	}
	f.BindFlags(cmd.Flags())
	return cmd
}

func (f *pushArtifactFlags) run(cmd *cobra.Command, url string) error {
	ctx := cmd.Context()
	if _, _, err := oci.ParseURL(url, f.insecure); err != nil {
		return err
	}
	src, err := dir.New(dir.Options{Path: f.path})
	if err != nil {
		return err
	}
	art, err := src.Fetch(ctx)
	if err != nil {
		return err
	}
	if n := countFiles(art.FS); n == 0 {
		return fmt.Errorf("push %s: directory %s holds no files", url, src.Path())
	}
	opts := oci.PushOptions{Tag: f.tag, Insecure: f.insecure, Annotations: map[string]string{}}
	if f.source != "" {
		opts.Annotations[oci.AnnotationSource] = f.source
	}
	if f.revision != "" {
		opts.Annotations[oci.AnnotationRevision] = f.revision
	}
	if f.dockerConfig != "" {
		data, err := os.ReadFile(f.dockerConfig)
		if err != nil {
			return fmt.Errorf("--docker-config: %w", err)
		}
		opts.Auth.DockerConfig = data
	} else {
		opts.Auth.Keychain = authn.DefaultKeychain
	}
	rev, err := oci.Push(ctx, url, art.FS, opts)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "pushed %s (%d bytes of files) to %s\nrevision: %s\n", src.Path(), art.Size, url, rev)
	return nil
}

// countFiles counts the regular files of an artifact.
func countFiles(fsys fs.FS) int {
	n := 0
	_ = fs.WalkDir(fsys, ".", func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return err
	})
	return n
}
