package git

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/storage/filesystem"

	"github.com/capstan-dev/capstan/sources"
)

// Bounds of what the pack check keeps in memory to name an oversized file:
// the trees of the commit and the deltas that may rebuild them. They are
// small in any repository that fits the file limits (a tree of 10,000
// entries is about 400 KiB); past them, the check still refuses what it
// must, only without the file's name.
const (
	maxKeptTreeBytes  = 16 << 20
	maxKeptDeltaBytes = 1 << 20
)

// checkedStorage is go-git's filesystem storage, on disk in a temporary
// directory, whose pack writer runs a packCheck over the pack as it
// streams in and hands the pack to go-git only once the check has passed
// it whole: go-git inflates every object of a pack whole while it indexes
// it, so a pack that breaks a limit must never reach it.
type checkedStorage struct {
	*filesystem.Storage
	dir    string // where the pack is staged
	limits sources.Limits
	err    error // what the check refused, if anything
}

var _ storer.PackfileWriter = (*checkedStorage)(nil)

// PackfileWriter implements storer.PackfileWriter.
func (s *checkedStorage) PackfileWriter() (io.WriteCloser, error) {
	staged, err := os.CreateTemp(s.dir, "incoming-*.pack")
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	w := &checkedPackWriter{staged: staged, pw: pw, done: make(chan struct{}), s: s}
	go func() {
		defer close(w.done)
		c := &packCheck{limits: s.limits}
		if err := c.run(pr); err != nil {
			w.err = err
			pr.CloseWithError(err)
			return
		}
		// The trailing checksum.
		_, _ = io.Copy(io.Discard, pr)
	}()
	return w, nil
}

// checkedPackWriter stages the pack in a file while the check reads it.
type checkedPackWriter struct {
	staged *os.File
	pw     *io.PipeWriter
	done   chan struct{}
	s      *checkedStorage
	raw    int64
	err    error // set by the check goroutine before done closes
}

func (w *checkedPackWriter) Write(p []byte) (int, error) {
	w.raw += int64(len(p))
	if max := w.s.limits.MaxDecompressedBytes; w.raw > max {
		// zlib never grows data much, so a pack larger than what its
		// objects may inflate to is refused outright.
		err := fmt.Errorf("%w: the pack is over %d bytes (--max-decompressed-bytes=%s)", sources.ErrRefused, max, sources.FormatBytes(max))
		w.pw.CloseWithError(err)
		return 0, err
	}
	if _, err := w.pw.Write(p); err != nil {
		return 0, err
	}
	return w.staged.Write(p)
}

// Close lets the check finish and, if it passed the pack, gives the
// staged pack to go-git's writer, which indexes and keeps it.
func (w *checkedPackWriter) Close() error {
	w.pw.Close()
	<-w.done
	defer func() {
		w.staged.Close()
		os.Remove(w.staged.Name())
	}()
	if w.err != nil {
		if errors.Is(w.err, sources.ErrRefused) {
			w.s.err = w.err // Fetch reports it as it is
		}
		return w.err
	}
	if _, err := w.staged.Seek(0, io.SeekStart); err != nil {
		return err
	}
	inner, err := w.s.Storage.PackfileWriter()
	if err != nil {
		return err
	}
	if _, err := io.Copy(inner, w.staged); err != nil {
		inner.Close()
		return err
	}
	return inner.Close()
}

// packCheck reads a pack stream object by object, inflating each through
// a counter and never holding one whole (but for commits and the trees it
// keeps to name files), and refuses it at the first object that breaks a
// limit: an object larger than the per-file limit (go-git would inflate
// it whole), more blobs or blob bytes than the artifact may hold, or more
// inflated bytes in total than the decompressed limit.
type packCheck struct {
	limits   sources.Limits
	inflated int64
	blobs    int
	blobSize int64
	rootTree plumbing.Hash
	// types of the objects seen, by offset and (when known) hash, for the
	// bases of deltas.
	byOffset map[int64]seenObject
	byHash   map[plumbing.Hash]seenObject
	trees    map[plumbing.Hash][]byte
	kept     int64
}

type seenObject struct {
	typ  plumbing.ObjectType
	hash plumbing.Hash // zero when not computed
}

func (c *packCheck) run(r io.Reader) error {
	c.byOffset = map[int64]seenObject{}
	c.byHash = map[plumbing.Hash]seenObject{}
	c.trees = map[plumbing.Hash][]byte{}
	s := packfile.NewScanner(r)
	_, count, err := s.Header()
	if err != nil {
		return packReadError("read pack header", err)
	}
	for i := uint32(0); i < count; i++ {
		oh, err := s.NextObjectHeader()
		if err != nil {
			return c.readError(err)
		}
		if err := c.object(s, oh); err != nil {
			return err
		}
	}
	return nil
}

// readError turns an error of the stream into the refusal it stands for:
// the decompressed limit, or a pack that does not parse.
func (c *packCheck) readError(err error) error {
	if errors.Is(err, errInflatedLimit) || errors.Is(err, sources.ErrRefused) {
		return c.inflatedError()
	}
	return packReadError("read pack", err)
}

// packReadError is a pack that does not parse: refused, unless it merely
// ended early (a connection that broke, a cancelled fetch), which a retry
// may fix.
func packReadError(op string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.ErrClosedPipe) {
		return fmt.Errorf("%s: the pack ended early: %w", op, err)
	}
	return fmt.Errorf("%w: %s: %w", sources.ErrRefused, op, err)
}

var errInflatedLimit = errors.New("inflated limit")

func (c *packCheck) inflatedError() error {
	max := c.limits.MaxDecompressedBytes
	return fmt.Errorf("%w: the pack's objects inflate to more than %d bytes (--max-decompressed-bytes=%s)", sources.ErrRefused, max, sources.FormatBytes(max))
}

// object checks one object whose header was just read.
func (c *packCheck) object(s *packfile.Scanner, oh *packfile.ObjectHeader) error {
	maxFile := c.limits.MaxFileBytes
	if oh.Length > maxFile {
		if oh.Type == plumbing.BlobObject {
			return c.oversizedBlob(s, oh)
		}
		return fmt.Errorf("%w: a %s object of %d bytes is over the limit of %d bytes per object (--max-file-bytes=%s)",
			sources.ErrRefused, oh.Type, oh.Length, maxFile, sources.FormatBytes(maxFile))
	}
	switch oh.Type {
	case plumbing.OFSDeltaObject, plumbing.REFDeltaObject:
		return c.delta(s, oh)
	case plumbing.BlobObject:
		if err := c.countBlob(oh.Length, ""); err != nil {
			return err
		}
		h := plumbing.NewHasher(oh.Type, oh.Length)
		if err := c.inflate(s, h); err != nil {
			return err
		}
		c.seen(oh.Offset, oh.Type, h.Sum())
		return nil
	case plumbing.CommitObject, plumbing.TreeObject:
		var buf bytes.Buffer
		if err := c.inflate(s, &buf); err != nil {
			return err
		}
		h := plumbing.ComputeHash(oh.Type, buf.Bytes())
		c.seen(oh.Offset, oh.Type, h)
		if oh.Type == plumbing.CommitObject {
			c.commit(buf.Bytes())
		} else {
			c.keepTree(h, buf.Bytes())
		}
		return nil
	default:
		h := plumbing.NewHasher(oh.Type, oh.Length)
		if err := c.inflate(s, h); err != nil {
			return err
		}
		c.seen(oh.Offset, oh.Type, h.Sum())
		return nil
	}
}

func (c *packCheck) seen(offset int64, typ plumbing.ObjectType, h plumbing.Hash) {
	o := seenObject{typ: typ, hash: h}
	c.byOffset[offset] = o
	if !h.IsZero() {
		c.byHash[h] = o
	}
}

// inflate inflates the current object into w, counting against the
// decompressed limit.
func (c *packCheck) inflate(s *packfile.Scanner, w io.Writer) error {
	cw := &countingWriter{w: w, c: c}
	if _, _, err := s.NextObject(cw); err != nil {
		if cw.over {
			return c.inflatedError()
		}
		return packReadError("read pack", err)
	}
	return nil
}

type countingWriter struct {
	w    io.Writer
	c    *packCheck
	over bool
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.c.inflated += int64(len(p))
	if w.c.inflated > w.c.limits.MaxDecompressedBytes {
		w.over = true
		return 0, errInflatedLimit
	}
	return w.w.Write(p)
}

// countBlob counts a blob of size bytes against the artifact's limits.
func (c *packCheck) countBlob(size int64, name string) error {
	c.blobs++
	c.blobSize += size
	switch {
	case c.blobs > c.limits.MaxFiles:
		return fmt.Errorf("%w: the repository has more than the limit of %d files", sources.ErrRefused, c.limits.MaxFiles)
	case c.blobSize > c.limits.MaxTotalBytes:
		max := c.limits.MaxTotalBytes
		return fmt.Errorf("%w: the files are over the limit of %d bytes in total (--max-artifact-bytes=%s); raise the limit or make the repository smaller",
			sources.ErrRefused, max, sources.FormatBytes(max))
	}
	return nil
}

// oversizedBlob refuses a blob over the per-file limit, naming its file
// when it can: the blob is hashed as it streams by (never held), if what
// is left of the decompressed limit allows, and looked up in the trees
// already seen, which git sends before the blobs.
func (c *packCheck) oversizedBlob(s *packfile.Scanner, oh *packfile.ObjectHeader) error {
	name := "a file"
	if oh.Length <= c.limits.MaxDecompressedBytes-c.inflated {
		h := plumbing.NewHasher(oh.Type, oh.Length)
		if err := c.inflate(s, h); err == nil {
			if p := c.pathOf(h.Sum()); p != "" {
				name = "file " + p
			} else {
				name = "blob " + h.Sum().String()
			}
		}
	}
	max := c.limits.MaxFileBytes
	return fmt.Errorf("%w: %s is %d bytes, over the limit of %d bytes per file (--max-file-bytes=%s); raise the limit or split the file",
		sources.ErrRefused, name, oh.Length, max, sources.FormatBytes(max))
}

// delta checks a deltified object: its delta data is bounded by its
// header, its result by the size the delta declares. Deltas of trees are
// applied, so that their trees can name files.
func (c *packCheck) delta(s *packfile.Scanner, oh *packfile.ObjectHeader) error {
	base, ok := c.byOffset[oh.OffsetReference]
	if oh.Type == plumbing.REFDeltaObject {
		base, ok = c.byHash[oh.Reference]
	}
	keep := oh.Length <= maxKeptDeltaBytes && ok && base.typ == plumbing.TreeObject
	var data bytes.Buffer
	head := &headWriter{keep: keep, buf: &data}
	if err := c.inflate(s, head); err != nil {
		return err
	}
	target, ok2 := deltaTargetSize(head.head)
	if !ok2 {
		return fmt.Errorf("%w: read pack: a delta at offset %d has no valid header", sources.ErrRefused, oh.Offset)
	}
	typ := base.typ
	if !ok {
		// A base outside this pack, or not seen yet: count it as a blob,
		// the strictest reading.
		typ = plumbing.BlobObject
	}
	max := c.limits.MaxFileBytes
	if target > max {
		if typ == plumbing.BlobObject {
			return fmt.Errorf("%w: a file of %d bytes is over the limit of %d bytes per file (--max-file-bytes=%s); raise the limit or split the file",
				sources.ErrRefused, target, max, sources.FormatBytes(max))
		}
		return fmt.Errorf("%w: a %s object of %d bytes is over the limit of %d bytes per object (--max-file-bytes=%s)",
			sources.ErrRefused, typ, target, max, sources.FormatBytes(max))
	}
	if typ == plumbing.BlobObject {
		if err := c.countBlob(target, ""); err != nil {
			return err
		}
	}
	var h plumbing.Hash
	if keep {
		if tree, err := packfile.PatchDelta(c.trees[base.hash], data.Bytes()); err == nil {
			h = plumbing.ComputeHash(plumbing.TreeObject, tree)
			c.keepTree(h, tree)
		}
	}
	c.seen(oh.Offset, typ, h)
	return nil
}

// headWriter keeps the first bytes of a delta (its two size varints) and,
// when asked, the whole delta.
type headWriter struct {
	head []byte
	keep bool
	buf  *bytes.Buffer
}

func (w *headWriter) Write(p []byte) (int, error) {
	if n := 20 - len(w.head); n > 0 {
		w.head = append(w.head, p[:min(n, len(p))]...)
	}
	if w.keep {
		w.buf.Write(p)
	}
	return len(p), nil
}

// deltaTargetSize reads the result size of a delta: the second of the two
// little-endian base-128 varints it starts with.
func deltaTargetSize(head []byte) (int64, bool) {
	var sizes [2]int64
	for i := range sizes {
		var v int64
		var shift uint
		for {
			if len(head) == 0 || shift > 56 {
				return 0, false
			}
			b := head[0]
			head = head[1:]
			v |= int64(b&0x7f) << shift
			shift += 7
			if b&0x80 == 0 {
				break
			}
		}
		sizes[i] = v
	}
	return sizes[1], true
}

// commit remembers the tree of the first commit, where paths start.
func (c *packCheck) commit(data []byte) {
	if !c.rootTree.IsZero() {
		return
	}
	if line, ok := strings.CutPrefix(string(data[:min(len(data), 46)]), "tree "); ok && len(line) >= 40 {
		c.rootTree = plumbing.NewHash(line[:40])
	}
}

func (c *packCheck) keepTree(h plumbing.Hash, data []byte) {
	if c.kept+int64(len(data)) > maxKeptTreeBytes {
		return
	}
	c.kept += int64(len(data))
	c.trees[h] = data
}

// pathOf finds a path of blob in the trees kept, from the commit's root.
func (c *packCheck) pathOf(blob plumbing.Hash) string {
	var walk func(tree plumbing.Hash, dir string, depth int) string
	walk = func(tree plumbing.Hash, dir string, depth int) string {
		data, ok := c.trees[tree]
		if !ok || depth > 64 {
			return ""
		}
		for len(data) > 0 {
			sp := bytes.IndexByte(data, ' ')
			nul := bytes.IndexByte(data, 0)
			if sp < 0 || nul < sp || len(data) < nul+21 {
				return ""
			}
			mode, name := string(data[:sp]), string(data[sp+1:nul])
			var h plumbing.Hash
			copy(h[:], data[nul+1:nul+21])
			data = data[nul+21:]
			switch {
			case mode == "40000":
				if p := walk(h, join(dir, name), depth+1); p != "" {
					return p
				}
			case h == blob && strings.HasPrefix(mode, "100"):
				return join(dir, name)
			}
		}
		return ""
	}
	return walk(c.rootTree, "", 0)
}
