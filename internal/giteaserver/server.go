package giteaserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"text/template"
	"time"
)

// Version is the Gitea release the harness looks for in the cache. It must
// match code.gitea.io/gitea in e2e/gitea/go.mod, which a test checks.
const Version = "v1.26.0"

// DirEnv overrides the directory holding the gitea binary, as in
// e2e/gitea/build.sh.
const DirEnv = "CAPSTAN_GITEA_DIR"

// AdminUser is the name of the admin user Start creates; repositories the
// helpers create belong to it.
const AdminUser = "capstan-admin"

// tokenPattern is what a Gitea access token looks like.
var tokenPattern = regexp.MustCompile(`^[0-9a-f]{40}$`)

// startTimeout bounds Start when the caller's context has no deadline.
const startTimeout = 2 * time.Minute

// Options configures Start.
type Options struct {
	// BinDir holds the gitea binary and the options/ and templates/
	// directories build.sh copies next to it. Empty means $CAPSTAN_GITEA_DIR
	// or build.sh's cache directory for Version.
	BinDir string
	// Log receives Gitea's own log (a test's debugging aid) in addition to
	// the log file Start keeps for error messages; nil keeps only the file.
	Log io.Writer
}

// Server is a running Gitea. Its methods may be called from several
// goroutines.
type Server struct {
	bin      string
	dir      string
	conf     string
	url      string
	password string
	token    string

	secretKey, internalToken string
	logPath                  string

	cmd  *exec.Cmd
	done chan struct{}
	err  error // the process's exit, set before done is closed

	stopOnce sync.Once
	stopErr  error
}

// BinDir returns where the gitea binary is looked for: $CAPSTAN_GITEA_DIR,
// or ${XDG_CACHE_HOME:-$HOME/.cache}/capstan/gitea/<Version>.
func BinDir() (string, error) {
	if dir := os.Getenv(DirEnv); dir != "" {
		return dir, nil
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("find the gitea cache directory: %w", err)
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "capstan", "gitea", Version), nil
}

// Start runs migrate, creates the admin user and its token, starts `gitea
// web` on a free port of 127.0.0.1 and waits until the API answers. ctx
// bounds the start (two minutes when it has no deadline); the server runs
// until Stop.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	binDir := opts.BinDir
	if binDir == "" {
		var err error
		if binDir, err = BinDir(); err != nil {
			return nil, err
		}
	}
	bin := filepath.Join(binDir, "gitea")
	if st, err := os.Stat(bin); err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return nil, fmt.Errorf("start gitea: no gitea binary at %s: run `make gitea` (e2e/gitea/build.sh builds Gitea %s from source, several minutes on 2 cores, cached afterwards) or point %s at a directory holding it",
			bin, Version, DirEnv)
	}

	dir, err := os.MkdirTemp("", "giteaserver-")
	if err != nil {
		return nil, fmt.Errorf("start gitea: create its directory: %w", err)
	}
	s := &Server{bin: bin, dir: dir, logPath: filepath.Join(dir, "gitea.log"), done: make(chan struct{})}
	if err := s.start(ctx, binDir, opts.Log); err != nil {
		return nil, errors.Join(err, s.Stop())
	}
	return s, nil
}

func (s *Server) start(ctx context.Context, binDir string, logTo io.Writer) error {
	s.password = randomHex(16)
	s.secretKey, s.internalToken = randomHex(32), randomHex(32)
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return fmt.Errorf("start gitea: %w", err)
		}
		s.url = fmt.Sprintf("http://127.0.0.1:%d", port)
		if err := s.writeConfig(binDir, port); err != nil {
			return err
		}
		if attempt == 1 {
			if err := s.setUp(ctx); err != nil {
				return err
			}
		}
		err = s.serve(ctx, logTo)
		// Another process may take the free port before Gitea binds it.
		if err == nil || attempt == 3 || !strings.Contains(s.logTail(), "address already in use") {
			return err
		}
		s.done = make(chan struct{})
	}
}

// setUp creates the database, the admin user and its token.
func (s *Server) setUp(ctx context.Context) error {
	if _, err := s.cli(ctx, "migrate"); err != nil {
		return err
	}
	if _, err := s.cli(ctx, "admin", "user", "create", "--username", AdminUser, "--password", s.password,
		"--email", AdminUser+"@capstan.invalid", "--admin", "--must-change-password=false"); err != nil {
		return err
	}
	out, err := s.cli(ctx, "admin", "user", "generate-access-token", "--username", AdminUser,
		"--token-name", "harness", "--scopes", "all", "--raw")
	if err != nil {
		return err
	}
	// The token is the one line that looks like one, whatever the CLI
	// logs around it.
	for line := range strings.Lines(out) {
		if l := strings.TrimSpace(line); tokenPattern.MatchString(l) {
			s.token = l
		}
	}
	if s.token == "" {
		return errors.New("start gitea: generate-access-token printed no token")
	}
	return nil
}

// serve starts `gitea web` and waits until /api/healthz answers 200.
func (s *Server) serve(ctx context.Context, logTo io.Writer) error {
	logFile, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("start gitea: open its log: %w", err)
	}
	var out io.Writer = logFile
	if logTo != nil {
		out = io.MultiWriter(logFile, logTo)
	}
	s.cmd = exec.Command(s.bin, "--config", s.conf, "--work-path", s.dir, "web")
	s.cmd.Dir = s.dir
	s.cmd.Env = s.env()
	s.cmd.Stdout, s.cmd.Stderr = out, out
	s.cmd.SysProcAttr = sysProcAttr()
	if err := s.cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start gitea web: %w", err)
	}
	go func() {
		s.err = s.cmd.Wait()
		logFile.Close()
		close(s.done)
	}()
	return s.waitReady(ctx)
}

func (s *Server) waitReady(ctx context.Context) error {
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := "no answer yet"
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/api/healthz", nil)
		if err != nil {
			return fmt.Errorf("wait for gitea: %w", err)
		}
		if resp, err := client.Do(req); err != nil {
			last = err.Error()
		} else {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		}
		select {
		case <-s.done:
			return fmt.Errorf("gitea web exited before it was ready (%v); its log ends:\n%s", s.err, s.logTail())
		case <-ctx.Done():
			return fmt.Errorf("gitea at %s not ready (%s): %w; its log ends:\n%s", s.url, last, ctx.Err(), s.logTail())
		case <-tick.C:
		}
	}
}

// cli runs one gitea command against the server's config and returns its
// standard output.
func (s *Server) cli(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, s.bin, append([]string{"--config", s.conf, "--work-path", s.dir}, args...)...)
	cmd.Dir = s.dir
	cmd.Env = s.env()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		// args may hold the admin password: name only the command.
		return "", fmt.Errorf("gitea %s: %w: %s", strings.Join(args[:min(len(args), 3)], " "), err,
			tail(stderr.String()+stdout.String(), 2048))
	}
	return stdout.String(), nil
}

func (s *Server) env() []string {
	env := []string{"HOME=" + s.dir, "GITEA_WORK_DIR=" + s.dir, "PATH=" + os.Getenv("PATH")}
	if u, err := user.Current(); err == nil {
		env = append(env, "USER="+u.Username)
	}
	return env
}

// Stop ends Gitea (SIGTERM, then SIGKILL after ten seconds) and removes its
// directory. It may be called more than once.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		var errs []error
		if s.cmd != nil && s.cmd.Process != nil {
			pgid := -s.cmd.Process.Pid
			_ = syscall.Kill(pgid, syscall.SIGTERM)
			select {
			case <-s.done:
			case <-time.After(10 * time.Second):
				_ = syscall.Kill(pgid, syscall.SIGKILL)
				<-s.done
			}
			// Anything Gitea started and left behind.
			_ = syscall.Kill(pgid, syscall.SIGKILL)
		}
		if err := os.RemoveAll(s.dir); err != nil {
			errs = append(errs, fmt.Errorf("remove gitea directory: %w", err))
		}
		s.stopErr = errors.Join(errs...)
	})
	return s.stopErr
}

// URL is Gitea's base URL, e.g. "http://127.0.0.1:41234", which is also the
// base URL of its API (the SDK appends /api/v1).
func (s *Server) URL() string { return s.url }

// Token is an access token of the admin user with every scope.
func (s *Server) Token() string { return s.token }

// LogTail returns the end of Gitea's log, for a failing test's message.
func (s *Server) LogTail() string { return s.logTail() }

func (s *Server) logTail() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	return tail(string(b), 4096)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// writeConfig writes app.ini: only what a test needs is on.
func (s *Server) writeConfig(binDir string, port int) error {
	runUser := "root"
	if u, err := user.Current(); err == nil {
		runUser = u.Username
	}
	for _, d := range []string{"custom/conf", "data", "repos", "log"} {
		if err := os.MkdirAll(filepath.Join(s.dir, d), 0o700); err != nil {
			return fmt.Errorf("start gitea: %w", err)
		}
	}
	var b bytes.Buffer
	if err := appIni.Execute(&b, map[string]any{
		"Dir":           s.dir,
		"StaticRoot":    binDir,
		"Port":          port,
		"URL":           s.url,
		"RunUser":       runUser,
		"SecretKey":     s.secretKey,
		"InternalToken": s.internalToken,
	}); err != nil {
		return fmt.Errorf("start gitea: write app.ini: %w", err)
	}
	s.conf = filepath.Join(s.dir, "custom", "conf", "app.ini")
	if err := os.WriteFile(s.conf, b.Bytes(), 0o600); err != nil {
		return fmt.Errorf("start gitea: write app.ini: %w", err)
	}
	return nil
}

// appIni is Gitea's configuration. Root is allowed because CI and the
// development containers run tests as root; webhooks may go to loopback
// because the receivers under test listen there; the queue lives in memory
// so that a webhook is sent as soon as the push is processed.
var appIni = template.Must(template.New("app.ini").Parse(`APP_NAME = Capstan test forge
RUN_MODE = prod
RUN_USER = {{.RunUser}}
WORK_PATH = {{.Dir}}
I_AM_BEING_UNSAFE_RUNNING_AS_ROOT = true

[server]
PROTOCOL = http
HTTP_ADDR = 127.0.0.1
HTTP_PORT = {{.Port}}
DOMAIN = 127.0.0.1
ROOT_URL = {{.URL}}/
APP_DATA_PATH = {{.Dir}}/data
STATIC_ROOT_PATH = {{.StaticRoot}}
OFFLINE_MODE = true
DISABLE_SSH = true
START_SSH_SERVER = false
LFS_START_SERVER = false

[database]
DB_TYPE = sqlite3
PATH = {{.Dir}}/data/gitea.db
SQLITE_JOURNAL_MODE = WAL

[repository]
ROOT = {{.Dir}}/repos
DEFAULT_BRANCH = main
DISABLE_STARS = true

[security]
INSTALL_LOCK = true
SECRET_KEY = {{.SecretKey}}
INTERNAL_TOKEN = {{.InternalToken}}
DISABLE_QUERY_AUTH_TOKEN = true

[service]
DISABLE_REGISTRATION = true
ENABLE_NOTIFY_MAIL = false
NO_REPLY_ADDRESS = capstan.invalid

[mailer]
ENABLED = false

[oauth2]
ENABLED = false

[openid]
ENABLE_OPENID_SIGNIN = false
ENABLE_OPENID_SIGNUP = false

[webhook]
ALLOWED_HOST_LIST = loopback
DELIVER_TIMEOUT = 10

[queue]
TYPE = channel

[cache]
ADAPTER = memory

[session]
PROVIDER = memory

[indexer]
ISSUE_INDEXER_TYPE = db
REPO_INDEXER_ENABLED = false

[cron]
ENABLED = false

[cron.update_checker]
ENABLED = false

[actions]
ENABLED = false

[packages]
ENABLED = false

[federation]
ENABLED = false

[api]
ENABLE_SWAGGER = false

[metrics]
ENABLED = false

[log]
MODE = console
LEVEL = Warn
ROOT_PATH = {{.Dir}}/log

[log.console]
STDERR = true
`))
