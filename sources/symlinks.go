package sources

import (
	"context"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"
)

const (
	// MaxSymlinkHops is how many symlinks one path may pass through while
	// it is resolved, as Linux's ELOOP limit.
	MaxSymlinkHops = 40
	// MaxSymlinkTarget is the longest symlink target accepted (PATH_MAX).
	MaxSymlinkTarget = 4096
)

// Symlinks collects the symbolic links of an artifact while its regular
// files go into a Builder, and, once every file is in, replaces each
// link by a copy of what it resolves to: a file, or a whole directory. An
// Artifact never holds a link, so nothing downstream can be led outside
// the artifact by one. A link that resolves outside the artifact root,
// dangles, loops or would copy a directory into itself is refused, wrapping
// ErrRefused and naming the link. Every source uses it: git for the links
// of a commit's tree, OCI for those of an archive, dir for a folder's.
// The zero value is ready to use.
type Symlinks struct {
	links map[string]string // cleaned link path -> target as written
}

// Len returns the number of links recorded.
func (s *Symlinks) Len() int { return len(s.links) }

// Add records a link at name (a relative slash path, as for
// Builder.Add) pointing to target. Only the link's own path is
// checked here; where it points is checked by CopyInto, when every file is
// known.
func (s *Symlinks) Add(name, target string) error {
	clean, err := cleanPath(name)
	if err != nil {
		return fmt.Errorf("symlink: %w", err)
	}
	switch {
	case target == "" || strings.ContainsRune(target, 0):
		return fmt.Errorf("symlink %s: %w: empty target or a target with a NUL byte", clean, ErrRefused)
	case len(target) > MaxSymlinkTarget:
		return fmt.Errorf("symlink %s: %w: target is %d bytes, longer than %d", clean, ErrRefused, len(target), MaxSymlinkTarget)
	case strings.HasPrefix(target, "/"):
		return fmt.Errorf("symlink %s: %w: points to the absolute path %s, outside the artifact root", clean, ErrRefused, target)
	}
	if _, ok := s.links[clean]; ok {
		return fmt.Errorf("symlink %s: %w: a link already exists at that path", clean, ErrRefused)
	}
	if s.links == nil {
		s.links = map[string]string{}
	}
	s.links[clean] = target
	return nil
}

// CopyInto resolves every recorded link against the files already in b
// and the other links, and adds at each link's path a copy of its target.
// Copies count against b's limits like any file, so a link that fans a
// directory out many times is refused once the artifact is too big.
func (s *Symlinks) CopyInto(ctx context.Context, b *Builder) error {
	if len(s.links) == 0 {
		return nil
	}
	r := &linkResolver{b: b, links: s.links}
	for name := range b.files {
		r.files = append(r.files, name)
	}
	sort.Strings(r.files)
	for name := range s.links {
		r.names = append(r.names, name)
	}
	sort.Strings(r.names)
	for _, link := range r.names {
		if _, ok := b.files[link]; ok {
			return fmt.Errorf("symlink %s: %w: a file already exists at that path", link, ErrRefused)
		}
		if _, ok := b.dirs[link]; ok {
			return fmt.Errorf("symlink %s: %w: a directory already exists at that path", link, ErrRefused)
		}
	}
	for _, link := range r.names {
		if err := r.copyLink(ctx, link, link, []string{parent(link)}); err != nil {
			return err
		}
	}
	return nil
}

// linkResolver resolves links against a snapshot of the builder's files.
type linkResolver struct {
	b     *Builder
	links map[string]string
	files []string // sorted snapshot of the regular files, before any copy
	names []string // sorted link paths
}

// copyLink adds at dst a copy of what the link at link resolves to.
// expanding lists the real directories whose content is being copied, to
// catch a link that would copy a directory into itself.
func (r *linkResolver) copyLink(ctx context.Context, dst, link string, expanding []string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	target, isDir, err := r.resolve(link)
	if err != nil {
		return err
	}
	if !isDir {
		if err := r.b.copyFile(dst, target); err != nil {
			return fmt.Errorf("symlink %s: copy %s: %w", link, target, err)
		}
		return nil
	}
	for _, dir := range expanding {
		if within(dir, target) {
			return fmt.Errorf("symlink %s: %w: points to %s, which contains it: the copy would never end",
				link, ErrRefused, displayDir(target))
		}
	}
	return r.copyDir(ctx, dst, target, expanding)
}

// copyDir copies the files and links below the real directory src to dst.
func (r *linkResolver) copyDir(ctx context.Context, dst, src string, expanding []string) error {
	for _, name := range below(r.files, src) {
		if err := r.b.copyFile(join(dst, rel(src, name)), name); err != nil {
			return fmt.Errorf("copy directory %s to %s: %w", displayDir(src), dst, err)
		}
	}
	for _, link := range below(r.names, src) {
		if err := r.copyLink(ctx, join(dst, rel(src, link)), link, slices.Concat(expanding, []string{parent(link)})); err != nil {
			return err
		}
	}
	return nil
}

// resolve follows the link at link component by component, as the kernel
// would, and returns the real path it ends at and whether that is a
// directory ("" is the root).
func (r *linkResolver) resolve(link string) (string, bool, error) {
	refuse := func(format string, args ...any) (string, bool, error) {
		return "", false, fmt.Errorf("symlink %s: %w: %s", link, ErrRefused, fmt.Sprintf(format, args...))
	}
	var cur []string
	if dir := parent(link); dir != "" {
		cur = strings.Split(dir, "/")
	}
	pending := strings.Split(r.links[link], "/")
	hops := 1
	for len(pending) > 0 {
		c := pending[0]
		pending = pending[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(cur) == 0 {
				return refuse("points outside the artifact root")
			}
			cur = cur[:len(cur)-1]
			continue
		}
		p := join(strings.Join(cur, "/"), c)
		if target, ok := r.links[p]; ok {
			if hops++; hops > MaxSymlinkHops {
				return refuse("passes through more than %d symlinks", MaxSymlinkHops)
			}
			if strings.HasPrefix(target, "/") {
				return refuse("passes through %s, which points to the absolute path %s", p, target)
			}
			pending = append(strings.Split(target, "/"), pending...)
			continue
		}
		// A directory whose only entries are links is not in the builder
		// yet; the links below it make it one.
		if _, ok := r.b.dirs[p]; ok || len(below(r.names, p)) > 0 {
			cur = append(cur, c)
			continue
		}
		if _, ok := r.b.files[p]; ok {
			if hasComponents(pending) {
				return refuse("passes through %s, which is not a directory", p)
			}
			return p, false, nil
		}
		return refuse("points to %s, which does not exist in the artifact", p)
	}
	return strings.Join(cur, "/"), true, nil
}

// below returns the names in sorted that are below the directory dir ("" is
// the root), in order.
func below(sorted []string, dir string) []string {
	if dir == "" {
		return sorted
	}
	prefix := dir + "/"
	i := sort.SearchStrings(sorted, prefix)
	j := i
	for j < len(sorted) && strings.HasPrefix(sorted[j], prefix) {
		j++
	}
	return sorted[i:j]
}

// hasComponents reports whether pending still names something below the
// current path (anything but empty and "." components).
func hasComponents(pending []string) bool {
	for _, c := range pending {
		if c != "" && c != "." {
			return true
		}
	}
	return false
}

// within reports whether p is dir or below it ("" is the root).
func within(p, dir string) bool {
	return dir == "" || p == dir || strings.HasPrefix(p, dir+"/")
}

// parent returns the directory of p, "" for the root.
func parent(p string) string {
	if d := path.Dir(p); d != "." {
		return d
	}
	return ""
}

func rel(dir, p string) string {
	if dir == "" {
		return p
	}
	return strings.TrimPrefix(p, dir+"/")
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

func displayDir(p string) string {
	if p == "" {
		return "the artifact root"
	}
	return p
}

// CleanPath returns name in the form io/fs expects, or an error wrapping
// ErrRefused when name could not be a path inside an artifact (empty,
// absolute, climbing out with "..", a NUL byte or a backslash). Sources use
// it for entries that carry a path but no file, such as tar directories.
func CleanPath(name string) (string, error) {
	return cleanPath(name)
}
