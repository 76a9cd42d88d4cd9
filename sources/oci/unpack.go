package oci

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"slices"
	"strings"

	"github.com/capstan-dev/capstan/sources"
)

// tarOverheadPerEntry bounds what one tar entry may take besides its
// content (header blocks, PAX records, padding), for the limit on the
// decompressed stream.
const tarOverheadPerEntry = 4 << 10

// UnpackLimits bound one layer while it is unpacked.
type UnpackLimits struct {
	// Files bound the unpacked content: files, bytes per file, bytes in
	// total, and the decompressed stream. Zero fields take the defaults of
	// sources.DefaultLimits.
	Files sources.Limits
	// MaxEntries is the most tar entries (files, directories, links) the
	// layer may hold; zero means four times Files.MaxFiles.
	MaxEntries int
}

func (l UnpackLimits) withDefaults() UnpackLimits {
	l.Files = l.Files.WithDefaults()
	if l.MaxEntries <= 0 {
		l.MaxEntries = 4 * l.Files.MaxFiles
	}
	return l
}

// Unpack reads a tar stream, gzip-compressed or not (told apart by the gzip
// magic number), into a new in-memory sources.Builder and returns it; see
// UnpackInto.
func Unpack(ctx context.Context, r io.Reader, limits UnpackLimits) (*sources.Builder, error) {
	limits = limits.withDefaults()
	b := sources.NewMemFS(limits.Files)
	if err := UnpackInto(ctx, r, b, limits); err != nil {
		return nil, err
	}
	return b, nil
}

// UnpackInto reads a tar stream, gzip-compressed or not, into b, which
// enforces limits.Files (a disk builder streams each file to disk, so a
// layer never sits in memory). Regular files are added as they are;
// directories only shape paths; hard links and symlinks become copies of
// their targets when those lie inside the archive; device files, pipes and
// every other entry type are refused. A path that is absolute or climbs
// out with "..", a link that leaves the root, and content beyond the
// limits are refused too, each with an error that wraps sources.ErrRefused
// and names the entry.
//
// The decompressed stream is counted as it is read, so a small compressed
// layer that inflates to gigabytes (of padding, of skipped content, of
// files) is stopped at the limit, never read to its end.
func UnpackInto(ctx context.Context, r io.Reader, b *sources.Builder, limits UnpackLimits) error {
	limits = limits.withDefaults()
	br := bufio.NewReader(r)
	var stream io.Reader = br
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("%w: gzip header: %w", sources.ErrRefused, err)
		}
		defer zr.Close()
		stream = zr
	}
	maxStream, why := limits.maxStream()
	lr := &limitReader{r: stream, n: maxStream}
	overLimit := func() error {
		return fmt.Errorf("%w: the decompressed layer is over the limit of %d bytes (%s)", sources.ErrRefused, maxStream, why)
	}
	tr := tar.NewReader(lr)
	var links sources.Symlinks
	hardLinks := map[string]string{}
	for entries := 0; ; entries++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if lr.exceeded {
				return overLimit()
			}
			return fmt.Errorf("%w: read tar entry %d: %w", sources.ErrRefused, entries+1, err)
		}
		if entries >= limits.MaxEntries {
			return fmt.Errorf("%w: the layer holds more than the limit of %d tar entries", sources.ErrRefused, limits.MaxEntries)
		}
		if err := addEntry(b, &links, hardLinks, tr, hdr); err != nil {
			if lr.exceeded {
				return overLimit()
			}
			return err
		}
	}
	if len(hardLinks) > 0 {
		// Hard links name files of the archive itself, never other links:
		// resolve them all against the files added before any of them.
		names := slices.Sorted(maps.Keys(hardLinks))
		targets := make([]string, len(names))
		for i, name := range names {
			t, err := hardLinkTarget(b, name, hardLinks[name])
			if err != nil {
				return err
			}
			targets[i] = t
		}
		for i, name := range names {
			if err := b.AddCopy(name, targets[i]); err != nil {
				return fmt.Errorf("hard link %s: %w", name, err)
			}
		}
	}
	return links.CopyInto(ctx, b)
}

// maxStream is how many decompressed bytes a layer may have, and which
// limit says so: --max-decompressed-bytes, or what the files the artifact
// may hold take with their tar headers, whichever is smaller.
func (l UnpackLimits) maxStream() (int64, string) {
	byFiles := l.Files.MaxTotalBytes + int64(l.MaxEntries)*tarOverheadPerEntry + 2*tarOverheadPerEntry
	if d := l.Files.MaxDecompressedBytes; d < byFiles {
		return d, "--max-decompressed-bytes=" + sources.FormatBytes(d)
	}
	return byFiles, fmt.Sprintf("what --max-artifact-bytes=%s of files take with the headers of %d tar entries",
		sources.FormatBytes(l.Files.MaxTotalBytes), l.MaxEntries)
}

// addEntry adds one tar entry to b, or records it in links or hardLinks.
func addEntry(b *sources.Builder, links *sources.Symlinks, hardLinks map[string]string, tr *tar.Reader, hdr *tar.Header) error {
	name := hdr.Name
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeRegA:
		if err := b.Allow(name, hdr.Size); err != nil {
			return err
		}
		err := b.AddReader(name, tr, hdr.Size, fs.FileMode(hdr.Mode).Perm())
		if err != nil && sources.IsReadError(err) {
			return fmt.Errorf("%w: read %q: %w", sources.ErrRefused, name, err)
		}
		return err
	case tar.TypeDir:
		// Directories exist in an artifact only through the files below
		// them, but a bad name is still an attempt worth refusing.
		if trimmed := strings.TrimRight(name, "/"); trimmed != "." && trimmed != "" {
			_, err := sources.CleanPath(trimmed)
			return err
		}
		return nil
	case tar.TypeSymlink:
		return links.Add(name, hdr.Linkname)
	case tar.TypeLink:
		if err := b.Allow(name, 0); err != nil {
			return err
		}
		if _, ok := hardLinks[name]; ok {
			return fmt.Errorf("add %q: %w: a hard link already exists at that path", name, sources.ErrRefused)
		}
		hardLinks[name] = hdr.Linkname
		return nil
	case tar.TypeChar, tar.TypeBlock:
		return fmt.Errorf("add %q: %w: device file; an artifact holds regular files only", name, sources.ErrRefused)
	case tar.TypeFifo:
		return fmt.Errorf("add %q: %w: named pipe; an artifact holds regular files only", name, sources.ErrRefused)
	case tar.TypeXGlobalHeader:
		return nil
	case tar.TypeGNUSparse:
		return fmt.Errorf("add %q: %w: sparse file; pack the artifact without sparse files", name, sources.ErrRefused)
	default:
		return fmt.Errorf("add %q: %w: unsupported tar entry type %q", name, sources.ErrRefused, hdr.Typeflag)
	}
}

// hardLinkTarget returns the regular file of b that the hard link at name
// names. A hard link can only name an earlier entry of the same archive,
// so one that names anything else (a path outside, a directory, a
// symlink) is refused.
func hardLinkTarget(b *sources.Builder, name, target string) (string, error) {
	clean, err := sources.CleanPath(target)
	if err != nil {
		return "", fmt.Errorf("hard link %s: %w: points to %q, outside the artifact root", name, sources.ErrRefused, target)
	}
	if !b.IsFile(clean) {
		return "", fmt.Errorf("hard link %s: %w: points to %s, which is not a regular file in the artifact", name, sources.ErrRefused, target)
	}
	return clean, nil
}

// limitReader reads at most n bytes and then fails, remembering that it
// did, so that the caller can tell a stream over its limit from a corrupt
// one.
type limitReader struct {
	r        io.Reader
	n        int64
	exceeded bool
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		l.exceeded = true
		return 0, errStreamLimit
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

var errStreamLimit = errors.New("stream over its size limit")
