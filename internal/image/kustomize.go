package image

import (
	"fmt"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// SetKustomizeImage points the `images:` entry called imageName of the
// kustomization file at path to ref, as `kustomize edit set image` does:
// newName is ref's repository as written, then newTag for REPO:TAG or
// digest for REPO@DIGEST (the other is removed). The entry is added when
// missing. Comments, key order and the sequence indentation of the file
// are kept.
func SetKustomizeImage(path, imageName, ref string) error {
	repo, tag, digest, err := splitRef(ref)
	if err != nil {
		return fmt.Errorf("set image %s in %s: %w", imageName, path, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("set image %s: %w", imageName, err)
	}
	node, err := yaml.Parse(string(data))
	if err != nil {
		return fmt.Errorf("set image %s in %s: %w", imageName, path, err)
	}
	images, err := node.Pipe(yaml.LookupCreate(yaml.SequenceNode, "images"))
	if err != nil {
		return fmt.Errorf("set image %s in %s: images: %w", imageName, path, err)
	}
	entry, err := images.Pipe(yaml.ElementMatcher{
		Keys:   []string{"name"},
		Values: []string{imageName},
		Create: yaml.NewMapRNode(&map[string]string{"name": imageName}),
	})
	if err != nil {
		return fmt.Errorf("set image %s in %s: %w", imageName, path, err)
	}
	set, clear := map[string]string{"newName": repo, "newTag": tag, "digest": digest}, "digest"
	if digest != "" {
		clear = "newTag"
	}
	delete(set, clear)
	// One PipeE per edit: a pipe hands each filter's result to the next,
	// and Clear's result is the removed value, not the entry.
	if err := entry.PipeE(yaml.Clear(clear)); err != nil {
		return fmt.Errorf("set image %s in %s: %w", imageName, path, err)
	}
	// Fixed order, so that a new entry reads name, newName, newTag.
	for _, k := range []string{"newName", "newTag", "digest"} {
		v, ok := set[k]
		if !ok {
			continue
		}
		// An existing value is edited in place to keep its comments.
		if f := entry.Field(k); f != nil && f.Value.YNode().Kind == yaml.ScalarNode {
			f.Value.YNode().Value, f.Value.YNode().Tag = v, yaml.NodeTagString
			continue
		}
		if err := entry.PipeE(yaml.SetField(k, yaml.NewStringRNode(v))); err != nil {
			return fmt.Errorf("set image %s in %s: %s: %w", imageName, path, k, err)
		}
	}
	out, err := yaml.MarshalWithOptions(node.Document(), &yaml.EncoderOptions{SeqIndent: yaml.SequenceIndentStyle(yaml.DeriveSeqIndentStyle(string(data)))})
	if err != nil {
		return fmt.Errorf("set image %s in %s: %w", imageName, path, err)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return fmt.Errorf("set image %s: %w", imageName, err)
	}
	return nil
}

// splitRef splits REPO:TAG or REPO@DIGEST into the repository as written
// (no index.docker.io/library/ added) and the tag or the digest. A ref
// without either is refused: an install must name what it runs.
func splitRef(ref string) (repo, tag, digest string, err error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", "", "", fmt.Errorf("image reference: %w (want REPO:TAG or REPO@sha256:...)", err)
	}
	switch r := r.(type) {
	case name.Digest:
		digest = r.DigestStr()
		repo, _, _ = strings.Cut(ref, "@")
		// REPO:TAG@DIGEST: the digest wins, as in kustomize.
		if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
			repo = repo[:i]
		}
	case name.Tag:
		tag = r.TagStr()
		var ok bool
		if repo, ok = strings.CutSuffix(ref, ":"+tag); !ok {
			return "", "", "", fmt.Errorf("image reference %q has no tag: want REPO:TAG or REPO@sha256:...", ref)
		}
	}
	return repo, tag, digest, nil
}
