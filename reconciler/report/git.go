package report

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	gogit "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/storage/memory"

	"github.com/capstan-dev/capstan/sources"
	"github.com/capstan-dev/capstan/sources/git"
)

// pushRequest is one status commit: files (path to content) written on
// top of the branch's tip.
type pushRequest struct {
	url, branch string
	auth        git.Auth
	// caFrom names where auth's CA is set, for the hint of an untrusted
	// certificate; empty names spec.report.gitStatus.secretRef.
	caFrom      string
	files       map[string][]byte
	message     string
	name, email string
	retries     int
	now         func() time.Time
	// beforePush, when set, runs before each push (tests: a writer that
	// wins the race).
	beforePush func(attempt int)
}

// pushResult says what a push did.
type pushResult struct {
	// commit is the pushed commit; zero when the branch already held
	// every file as given.
	commit plumbing.Hash
	// when is the commit's time.
	when time.Time
	// changed are the files the commit changed.
	changed []string
	// raced counts the pushes that lost a race and were rebuilt.
	raced int
}

// errRaced says the branch moved between the fetch and the push.
var errRaced = errors.New("the status branch moved meanwhile")

// push commits req.files to req.branch of req.url and pushes, creating
// the branch (without history) when it does not exist. The branch's tip
// is fetched shallowly into memory, only the given files are written on
// top of its tree, and the push only succeeds if the branch is still at
// that tip; when it moved (someone else pushed), the files are written
// again on top of the new tip, up to req.retries times, with a short
// jittered backoff. Nothing else of the branch is ever changed.
func push(ctx context.Context, req pushRequest) (pushResult, error) {
	auth, display, err := git.TransportAuth(req.url, req.auth)
	if err != nil {
		return pushResult{}, err
	}
	var res pushResult
	for attempt := 0; ; attempt++ {
		err := pushOnce(ctx, req, auth, attempt, &res)
		if err == nil {
			return res, nil
		}
		if sources.IsUntrustedCertificate(err) {
			if req.caFrom == "" {
				req.caFrom = sources.CAKeyOf("spec.report.gitStatus.secretRef", "")
			}
			return res, fmt.Errorf("push status to %s branch %s: %s: %w", display, req.branch, sources.UntrustedCertificateHint(req.caFrom), err)
		}
		if !errors.Is(err, errRaced) || attempt >= req.retries {
			return res, fmt.Errorf("push status to %s branch %s: %w", display, req.branch, err)
		}
		res.raced++
		wait := time.Duration(50<<min(attempt, 5))*time.Millisecond + rand.N(50*time.Millisecond)
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("push status to %s branch %s: %w", display, req.branch, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// pushOnce is one attempt of push. It returns errRaced when the branch
// moved between the listing and the push.
func pushOnce(ctx context.Context, req pushRequest, auth transport.AuthMethod, attempt int, res *pushResult) error {
	st := memory.NewStorage()
	repo, err := gogit.Init(st, nil)
	if err != nil {
		return fmt.Errorf("init repository in memory: %w", err)
	}
	remote, err := repo.CreateRemote(&config.RemoteConfig{Name: "origin", URLs: []string{req.url}})
	if err != nil {
		return fmt.Errorf("add remote: %w", err)
	}
	branch := plumbing.NewBranchReferenceName(req.branch)
	tip, err := remoteTip(ctx, remote, auth, req, branch)
	if err != nil {
		return err
	}
	var base *object.Tree
	if !tip.IsZero() {
		err := remote.FetchContext(ctx, &gogit.FetchOptions{
			RefSpecs: []config.RefSpec{config.RefSpec(fmt.Sprintf("+%s:refs/remotes/origin/%s", branch, req.branch))},
			Depth:    1, Auth: auth, CABundle: req.auth.CABundle, Tags: gogit.NoTags,
		})
		if err != nil && !errors.Is(err, gogit.NoErrAlreadyUpToDate) {
			return fmt.Errorf("fetch: %w", err)
		}
		commit, err := repo.CommitObject(tip)
		if err != nil {
			// The branch moved between the listing and the fetch.
			return fmt.Errorf("%w: read commit %s: %v", errRaced, tip, err)
		}
		if base, err = commit.Tree(); err != nil {
			return fmt.Errorf("read tree of %s: %w", tip, err)
		}
	}
	changes := map[string]plumbing.Hash{}
	res.changed = res.changed[:0]
	for _, p := range slices.Sorted(maps.Keys(req.files)) {
		h := plumbing.ComputeHash(plumbing.BlobObject, req.files[p])
		if base != nil {
			if e, err := base.FindEntry(p); err == nil && e.Hash == h && e.Mode.IsFile() {
				continue
			}
		}
		if _, err := writeBlob(st, req.files[p]); err != nil {
			return err
		}
		changes[p] = h
		res.changed = append(res.changed, p)
	}
	if len(changes) == 0 {
		res.commit = plumbing.ZeroHash
		return nil
	}
	treeHash, err := writeTree(st, base, changes)
	if err != nil {
		return err
	}
	when := req.now() // git keeps whole seconds
	sig := object.Signature{Name: req.name, Email: req.email, When: when}
	c := &object.Commit{Author: sig, Committer: sig, Message: req.message, TreeHash: treeHash}
	if !tip.IsZero() {
		c.ParentHashes = []plumbing.Hash{tip}
	}
	obj := st.NewEncodedObject()
	if err := c.Encode(obj); err != nil {
		return fmt.Errorf("encode commit: %w", err)
	}
	commit, err := st.SetEncodedObject(obj)
	if err != nil {
		return fmt.Errorf("store commit: %w", err)
	}
	if err := st.SetReference(plumbing.NewHashReference(branch, commit)); err != nil {
		return fmt.Errorf("set branch: %w", err)
	}
	opts := &gogit.PushOptions{
		RefSpecs: []config.RefSpec{config.RefSpec(fmt.Sprintf("%s:%s", branch, branch))},
		Auth:     auth, CABundle: req.auth.CABundle,
	}
	if !tip.IsZero() {
		// Compare and swap: the push succeeds only while the branch is
		// still at the tip the files were written on.
		opts.ForceWithLease = &gogit.ForceWithLease{RefName: branch, Hash: tip}
	}
	if req.beforePush != nil {
		req.beforePush(attempt)
	}
	if err := remote.PushContext(ctx, opts); err != nil && !errors.Is(err, gogit.NoErrAlreadyUpToDate) {
		// Whatever the error says, a branch that is no longer at tip
		// lost a race: write the files again on top of its new tip.
		if now, lerr := remoteTip(ctx, remote, auth, req, branch); lerr == nil && now != tip {
			return fmt.Errorf("%w (%v)", errRaced, err)
		}
		return fmt.Errorf("push: %w", err)
	}
	res.commit, res.when = commit, when
	return nil
}

// remoteTip returns the commit branch points at in the remote; zero when
// the branch or every branch is missing.
func remoteTip(ctx context.Context, remote *gogit.Remote, auth transport.AuthMethod, req pushRequest, branch plumbing.ReferenceName) (plumbing.Hash, error) {
	refs, err := remote.ListContext(ctx, &gogit.ListOptions{Auth: auth, CABundle: req.auth.CABundle})
	if errors.Is(err, transport.ErrEmptyRemoteRepository) {
		return plumbing.ZeroHash, nil
	}
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("list branches: %w", err)
	}
	for _, r := range refs {
		if r.Name() == branch && r.Type() == plumbing.HashReference {
			return r.Hash(), nil
		}
	}
	return plumbing.ZeroHash, nil
}

func writeBlob(s storer.EncodedObjectStorer, content []byte) (plumbing.Hash, error) {
	obj := s.NewEncodedObject()
	obj.SetType(plumbing.BlobObject)
	w, err := obj.Writer()
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("write blob: %w", err)
	}
	if _, err := w.Write(content); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("write blob: %w", err)
	}
	if err := w.Close(); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("write blob: %w", err)
	}
	return s.SetEncodedObject(obj)
}

// writeTree stores the tree base (nil: empty) with the files of changes
// (slash-separated path to blob) written in, and returns its hash. Only
// the trees on the changed paths are written again.
func writeTree(s storer.EncodedObjectStorer, base *object.Tree, changes map[string]plumbing.Hash) (plumbing.Hash, error) {
	entries := map[string]object.TreeEntry{}
	if base != nil {
		for _, e := range base.Entries {
			entries[e.Name] = e
		}
	}
	subdirs := map[string]map[string]plumbing.Hash{}
	for p, h := range changes {
		dir, rest, nested := strings.Cut(p, "/")
		if !nested {
			entries[p] = object.TreeEntry{Name: p, Mode: filemode.Regular, Hash: h}
			continue
		}
		if subdirs[dir] == nil {
			subdirs[dir] = map[string]plumbing.Hash{}
		}
		subdirs[dir][rest] = h
	}
	for dir, sub := range subdirs {
		var child *object.Tree
		if e, ok := entries[dir]; ok && e.Mode == filemode.Dir {
			t, err := object.GetTree(s, e.Hash)
			if err != nil {
				return plumbing.ZeroHash, fmt.Errorf("read tree %s: %w", dir, err)
			}
			child = t
		}
		h, err := writeTree(s, child, sub)
		if err != nil {
			return plumbing.ZeroHash, err
		}
		entries[dir] = object.TreeEntry{Name: dir, Mode: filemode.Dir, Hash: h}
	}
	t := &object.Tree{}
	for _, e := range entries {
		t.Entries = append(t.Entries, e)
	}
	// Git's order: by name, a directory compared as if its name ended in /.
	sortName := func(e object.TreeEntry) string {
		if e.Mode == filemode.Dir {
			return e.Name + "/"
		}
		return e.Name
	}
	slices.SortFunc(t.Entries, func(a, b object.TreeEntry) int { return strings.Compare(sortName(a), sortName(b)) })
	obj := s.NewEncodedObject()
	if err := t.Encode(obj); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("encode tree: %w", err)
	}
	return s.SetEncodedObject(obj)
}
