package gitserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// The author and committer of every commit the server makes.
const (
	// AuthorName is the name on commits made by Commit.
	AuthorName = "Capstan Test"
	// AuthorEmail is the email on commits made by Commit.
	AuthorEmail = "test@capstan.invalid"
)

// DefaultBranch is the branch CreateRepo points HEAD at.
const DefaultBranch = "main"

// Deleted, as a value in the map given to Commit, deletes the file at that
// path instead of writing it.
const Deleted = "\x00gitserver:deleted\x00"

// File is one change in a CommitFiles call.
type File struct {
	// Path is the file's slash-separated path in the repository.
	Path string
	// Content is the file's content; for a symlink its target; for a
	// gitlink (submodule) the commit hash it points at.
	Content string
	// Executable commits the file with mode 100755.
	Executable bool
	// Symlink commits a symbolic link (mode 120000) to Content.
	Symlink bool
	// Gitlink commits a submodule entry (mode 160000) at commit Content.
	Gitlink bool
	// Delete removes the path from the tree; Content is ignored.
	Delete bool
}

// CreateRepo creates an empty bare repository name (".git" is appended
// unless present) with HEAD at refs/heads/main, accepting pushes over HTTP,
// and returns its HTTP URL.
func (s *Server) CreateRepo(name string) (string, error) {
	dir, err := s.repoDir(name)
	if err != nil {
		return "", err
	}
	ctx := context.Background()
	if _, err := s.run(ctx, "", nil, nil, "init", "--bare", "--quiet", "--initial-branch="+DefaultBranch, dir); err != nil {
		return "", fmt.Errorf("create repository %s: %w", name, err)
	}
	if _, err := s.run(ctx, dir, nil, nil, "config", "http.receivepack", "true"); err != nil {
		return "", fmt.Errorf("enable pushes to repository %s: %w", name, err)
	}
	return s.HTTPURL(name), nil
}

// RepoPath returns the directory of the bare repository name.
func (s *Server) RepoPath(name string) string {
	return filepath.Join(s.dir, filepath.FromSlash(repoName(name)))
}

// HTTPURL returns the HTTP URL of repository name, without credentials.
func (s *Server) HTTPURL(name string) string { return s.url + "/" + repoName(name) }

// FileURL returns the file:// URL of repository name.
func (s *Server) FileURL(name string) string { return "file://" + filepath.ToSlash(s.RepoPath(name)) }

func repoName(name string) string {
	if strings.HasSuffix(name, ".git") {
		return name
	}
	return name + ".git"
}

func (s *Server) repoDir(name string) (string, error) {
	clean := path.Clean(name)
	if name == "" || clean != name || path.IsAbs(name) || clean == ".." || strings.HasPrefix(clean, "../") {
		return "", fmt.Errorf("create repository %q: name must be a clean relative path", name)
	}
	return s.RepoPath(name), nil
}

// Commit writes files (path to content; the value Deleted removes a path)
// on top of branch's current tree and returns the new commit's hash. Paths
// not named keep their content: it overlays, it does not replace the tree.
// A branch that does not exist yet starts from the tip of main, or from an
// empty tree when main has no commit either. The commit is made directly in
// the bare repository on disk, so it costs no HTTP request.
func (s *Server) Commit(repo, branch string, files map[string]string, message string) (string, error) {
	changes := make([]File, 0, len(files))
	for p, content := range files {
		changes = append(changes, File{Path: p, Content: content, Delete: content == Deleted})
	}
	slices.SortFunc(changes, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	return s.CommitFiles(repo, branch, changes, message)
}

// CommitFiles is Commit with control over file modes: executables,
// symlinks, gitlinks and deletions.
func (s *Server) CommitFiles(repo, branch string, files []File, message string) (string, error) {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	ctx := context.Background()
	gitDir := s.RepoPath(repo)
	if _, err := os.Stat(gitDir); err != nil {
		return "", fmt.Errorf("commit to %s: repository does not exist: %w", repo, err)
	}
	tmp, err := os.MkdirTemp("", "gitserver-index-")
	if err != nil {
		return "", fmt.Errorf("commit to %s: %w", repo, err)
	}
	defer os.RemoveAll(tmp)
	env := []string{"GIT_DIR=" + gitDir, "GIT_INDEX_FILE=" + filepath.Join(tmp, "index")}
	git := func(stdin io.Reader, args ...string) (string, error) {
		out, err := s.run(ctx, "", env, stdin, args...)
		return strings.TrimSpace(out), err
	}

	ref := "refs/heads/" + branch
	parent, _ := git(nil, "rev-parse", "--verify", "--quiet", ref+"^{commit}")
	base := parent
	if base == "" {
		base, _ = git(nil, "rev-parse", "--verify", "--quiet", "refs/heads/"+DefaultBranch+"^{commit}")
	}
	if base != "" {
		if _, err := git(nil, "read-tree", base); err != nil {
			return "", fmt.Errorf("commit to %s %s: read tree: %w", repo, branch, err)
		}
	}

	var index strings.Builder
	for _, f := range files {
		line, err := indexLine(f, func(content string) (string, error) {
			return git(strings.NewReader(content), "hash-object", "-w", "--stdin")
		})
		if err != nil {
			return "", fmt.Errorf("commit to %s %s: %s: %w", repo, branch, f.Path, err)
		}
		index.WriteString(line)
	}
	if _, err := git(strings.NewReader(index.String()), "update-index", "--index-info"); err != nil {
		return "", fmt.Errorf("commit to %s %s: update index: %w", repo, branch, err)
	}
	tree, err := git(nil, "write-tree")
	if err != nil {
		return "", fmt.Errorf("commit to %s %s: write tree: %w", repo, branch, err)
	}
	args := []string{"commit-tree", tree, "-m", message}
	if base != "" {
		args = append(args, "-p", base)
	}
	commit, err := git(nil, args...)
	if err != nil {
		return "", fmt.Errorf("commit to %s %s: %w", repo, branch, err)
	}
	// Passing the old value makes the update fail rather than lose a
	// commit if something else moved the branch meanwhile.
	if _, err := git(nil, "update-ref", ref, commit, parent); err != nil {
		return "", fmt.Errorf("commit to %s %s: move branch: %w", repo, branch, err)
	}
	return commit, nil
}

// indexLine returns the `git update-index --index-info` line for f,
// writing its blob with hashObject.
func indexLine(f File, hashObject func(string) (string, error)) (string, error) {
	if strings.ContainsAny(f.Path, "\t\n") || f.Path == "" {
		return "", errors.New("path is empty or holds a tab or newline")
	}
	if f.Delete {
		return "0 " + strings.Repeat("0", 40) + "\t" + f.Path + "\n", nil
	}
	if f.Gitlink {
		return "160000 " + f.Content + "\t" + f.Path + "\n", nil
	}
	mode := "100644"
	switch {
	case f.Symlink:
		mode = "120000"
	case f.Executable:
		mode = "100755"
	}
	hash, err := hashObject(f.Content)
	if err != nil {
		return "", fmt.Errorf("write blob: %w", err)
	}
	return mode + " " + hash + "\t" + f.Path + "\n", nil
}

// run runs the git CLI in dir (the server directory when empty) with the
// server's environment plus env, and returns its standard output. Errors
// carry git's standard error.
func (s *Server) run(ctx context.Context, dir string, env []string, stdin io.Reader, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	if dir == "" {
		cmd.Dir = s.dir
	}
	cmd.Env = slices.Concat(s.gitEnv, env)
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("git %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
