package gitserver

import (
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// maxBufferedBody bounds a chunked request body that the server buffers for
// CGI (which cannot take chunked bodies). Test pushes are far smaller.
const maxBufferedBody = 256 << 20

// Options configures a Server.
type Options struct {
	// Username and Password, when Username is set, make every HTTP request
	// need basic auth with exactly these credentials. Pushes are accepted
	// from authenticated requests, as a hosted git service would.
	Username string
	Password string
	// Stderr receives what git http-backend and git daemon print on
	// standard error (a test's debugging aid); nil discards it.
	Stderr io.Writer
	// TLSCertificate, when set, makes the server speak https with this
	// certificate instead of plain http (a server whose CA a client must
	// be told about, e.g. one from internal/testca).
	TLSCertificate *tls.Certificate
}

// Server serves the bare repositories under one directory over HTTP or
// HTTPS (git http-backend) and, once started, over git:// (git daemon)
// and ssh. It
// counts the HTTP requests it serves so that tests can assert how much a
// client talked to it. Close stops everything it started. Its methods may
// be called from several goroutines, except StartDaemon and StartSSH, which
// a test calls once before it shares the server.
type Server struct {
	dir     string
	ownsDir bool
	opts    Options
	gitEnv  []string

	listener net.Listener
	http     *http.Server
	cgiEnv   []string
	cgiPath  string
	url      string

	total   atomic.Int64
	mu      sync.Mutex
	perPath map[string]int64

	commitMu sync.Mutex

	daemon *daemon
	ssh    *sshServer
}

// New starts an HTTP git server for the bare repositories under dir
// (created if missing; a temporary directory, removed on Close, when dir is
// empty). It listens on a free port of 127.0.0.1.
func New(dir string, opts Options) (*Server, error) {
	if opts.Stderr == nil {
		opts.Stderr = io.Discard
	}
	s := &Server{opts: opts, perPath: make(map[string]int64), gitEnv: gitEnv()}
	if dir == "" {
		tmp, err := os.MkdirTemp("", "gitserver-")
		if err != nil {
			return nil, fmt.Errorf("create git server directory: %w", err)
		}
		dir, s.ownsDir = tmp, true
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create git server directory %s: %w", dir, err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("resolve git server directory %s: %w", dir, err)
	}
	s.dir = abs

	execPath, err := s.run(context.Background(), "", nil, nil, "--exec-path")
	if err != nil {
		s.cleanup()
		return nil, fmt.Errorf("find git-http-backend: %w", err)
	}
	s.cgiPath = filepath.Join(strings.TrimSpace(execPath), "git-http-backend")
	s.cgiEnv = slices.Concat(s.gitEnv, []string{"GIT_PROJECT_ROOT=" + s.dir, "GIT_HTTP_EXPORT_ALL=1"})

	s.listener, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.cleanup()
		return nil, fmt.Errorf("listen for git http: %w", err)
	}
	s.url = "http://" + s.listener.Addr().String()
	if c := opts.TLSCertificate; c != nil {
		s.listener = tls.NewListener(s.listener, &tls.Config{Certificates: []tls.Certificate{*c}, MinVersion: tls.VersionTLS12})
		s.url = "https://" + s.listener.Addr().String()
	}
	s.http = &http.Server{Handler: http.HandlerFunc(s.serveHTTP), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.http.Serve(s.listener) }()
	return s, nil
}

// URL returns the server's base HTTP URL, e.g. "http://127.0.0.1:41234"
// ("https://..." with Options.TLSCertificate).
func (s *Server) URL() string { return s.url }

// Dir returns the directory holding the bare repositories.
func (s *Server) Dir() string { return s.dir }

// Close stops the HTTP server, the git daemon and the ssh server, and
// removes the directory if New created it.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var errs []error
	if s.http != nil {
		if err := s.http.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop git http server: %w", err))
		}
	}
	if s.daemon != nil {
		errs = append(errs, s.daemon.stop())
	}
	if s.ssh != nil {
		errs = append(errs, s.ssh.stop())
	}
	errs = append(errs, s.cleanup())
	return errors.Join(errs...)
}

func (s *Server) cleanup() error {
	if !s.ownsDir {
		return nil
	}
	if err := os.RemoveAll(s.dir); err != nil {
		return fmt.Errorf("remove git server directory: %w", err)
	}
	return nil
}

// Requests returns how many HTTP requests the server has received, refused
// ones (bad credentials) included.
func (s *Server) Requests() int64 { return s.total.Load() }

// RequestsTo returns how many HTTP requests the server has received for
// one URL path, e.g. "/infra.git/info/refs" (the ls-remote request) or
// "/infra.git/git-upload-pack" (a fetch).
func (s *Server) RequestsTo(path string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perPath[path]
}

// RequestLog returns a copy of the per-path request counts.
func (s *Server) RequestLog() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int64, len(s.perPath))
	for k, v := range s.perPath {
		out[k] = v
	}
	return out
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	s.total.Add(1)
	s.mu.Lock()
	s.perPath[r.URL.Path]++
	s.mu.Unlock()

	env := s.cgiEnv
	if s.opts.Username != "" {
		user, pass, ok := r.BasicAuth()
		if !ok || !equal(user, s.opts.Username) || !equal(pass, s.opts.Password) {
			w.Header().Set("WWW-Authenticate", `Basic realm="gitserver"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		// http-backend enables receive-pack for requests with a
		// REMOTE_USER, the way a web server that authenticated them would.
		env = slices.Concat(env, []string{"REMOTE_USER=" + user})
	}
	if r.ContentLength < 0 && r.Body != nil {
		// The git CLI sends large pushes chunked; CGI needs a length.
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBufferedBody+1))
		if err != nil || len(body) > maxBufferedBody {
			http.Error(w, "request body unreadable or too large", http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.TransferEncoding = nil
	}
	h := &cgi.Handler{Path: s.cgiPath, Dir: s.dir, Env: env, Stderr: s.opts.Stderr}
	h.ServeHTTP(w, r)
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// gitEnv is the environment of every git process the server starts: the
// caller's, without its GIT_* variables and without user or system config,
// so that a developer's ~/.gitconfig cannot change what a test sees.
func gitEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GIT_") {
			env = append(env, kv)
		}
	}
	return append(env,
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME="+AuthorName,
		"GIT_AUTHOR_EMAIL="+AuthorEmail,
		"GIT_COMMITTER_NAME="+AuthorName,
		"GIT_COMMITTER_EMAIL="+AuthorEmail,
	)
}
