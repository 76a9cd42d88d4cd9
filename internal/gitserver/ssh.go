package gitserver

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// SSHUser is the user name in the URLs SSHURL returns. The server accepts
// any user name; only the key counts.
const SSHUser = "git"

// sshServer is an SSH server whose only service is running git-upload-pack
// and git-receive-pack on the server's repositories, as hosted git
// services do.
type sshServer struct {
	listener net.Listener
	config   *ssh.ServerConfig
	root     string
	env      []string
	wg       sync.WaitGroup
	closed   atomic.Bool
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	sessions atomic.Int64
}

// StartSSH starts an SSH git server on a free port of 127.0.0.1 that
// accepts the client key authorized, and returns a known_hosts line for
// its freshly generated ed25519 host key. SSHURL gives a repository's URL.
// Calling it twice is an error.
func (s *Server) StartSSH(ctx context.Context, authorized ssh.PublicKey) (knownHosts []byte, err error) {
	if s.ssh != nil {
		return nil, errors.New("start ssh git server: already started")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("start ssh git server: %w", err)
	}
	_, hostPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("start ssh git server: generate host key: %w", err)
	}
	hostSigner, err := ssh.NewSignerFromKey(hostPriv)
	if err != nil {
		return nil, fmt.Errorf("start ssh git server: host key: %w", err)
	}
	want := authorized.Marshal()
	config := &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if bytes.Equal(key.Marshal(), want) {
				return &ssh.Permissions{}, nil
			}
			return nil, errors.New("key not authorized")
		},
	}
	config.AddHostKey(hostSigner)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("start ssh git server: %w", err)
	}
	srv := &sshServer{listener: l, config: config, root: s.dir, env: s.gitEnv, conns: make(map[net.Conn]struct{})}
	srv.wg.Add(1)
	go srv.serve()
	s.ssh = srv
	line := knownhosts.Line([]string{knownhosts.Normalize(l.Addr().String())}, hostSigner.PublicKey())
	return []byte(line + "\n"), nil
}

// SSHURL returns the ssh:// URL of repository name; it is empty until
// StartSSH has succeeded.
func (s *Server) SSHURL(name string) string {
	if s.ssh == nil {
		return ""
	}
	return "ssh://" + SSHUser + "@" + s.ssh.listener.Addr().String() + "/" + repoName(name)
}

// SSHSessions returns how many ssh sessions (one per git command a client
// ran) the ssh server has served.
func (s *Server) SSHSessions() int64 {
	if s.ssh == nil {
		return 0
	}
	return s.ssh.sessions.Load()
}

func (srv *sshServer) serve() {
	defer srv.wg.Done()
	for {
		conn, err := srv.listener.Accept()
		if err != nil {
			return
		}
		srv.mu.Lock()
		if srv.closed.Load() {
			srv.mu.Unlock()
			_ = conn.Close()
			return
		}
		srv.conns[conn] = struct{}{}
		srv.wg.Add(1)
		srv.mu.Unlock()
		go func() {
			defer srv.wg.Done()
			srv.handleConn(conn)
			srv.mu.Lock()
			delete(srv.conns, conn)
			srv.mu.Unlock()
		}()
	}
}

func (srv *sshServer) handleConn(conn net.Conn) {
	defer conn.Close()
	sconn, chans, reqs, err := ssh.NewServerConn(conn, srv.config)
	if err != nil {
		return
	}
	defer sconn.Close()
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "only session channels")
			continue
		}
		ch, chReqs, err := nc.Accept()
		if err != nil {
			continue
		}
		srv.sessions.Add(1)
		go srv.handleSession(ch, chReqs)
	}
}

func (srv *sshServer) handleSession(ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer ch.Close()
	for req := range reqs {
		switch req.Type {
		case "env":
			_ = req.Reply(true, nil)
		case "exec":
			cmd, err := srv.command(req.Payload)
			if err != nil {
				_ = req.Reply(false, nil)
				fmt.Fprintf(ch.Stderr(), "gitserver: %v\n", err)
				sendExitStatus(ch, 1)
				return
			}
			_ = req.Reply(true, nil)
			sendExitStatus(ch, srv.run(cmd, ch))
			return
		default:
			_ = req.Reply(false, nil)
		}
	}
}

// command turns an exec payload such as "git-upload-pack '/infra.git'" into
// the git command to run, refusing any other program and any path outside
// the server's directory.
func (srv *sshServer) command(payload []byte) (*exec.Cmd, error) {
	if len(payload) < 4 || int(binary.BigEndian.Uint32(payload)) != len(payload)-4 {
		return nil, errors.New("malformed exec request")
	}
	line := string(payload[4:])
	program, arg, ok := strings.Cut(line, " ")
	if !ok || (program != "git-upload-pack" && program != "git-receive-pack") {
		return nil, fmt.Errorf("only git-upload-pack and git-receive-pack are served, not %q", line)
	}
	repo := path.Clean("/" + strings.Trim(arg, `'"`))
	dir := filepath.Join(srv.root, filepath.FromSlash(repo))
	cmd := exec.Command("git", strings.TrimPrefix(program, "git-"), dir)
	cmd.Dir = srv.root
	cmd.Env = srv.env
	return cmd, nil
}

// run runs cmd with its standard streams on the channel and returns its
// exit status.
func (srv *sshServer) run(cmd *exec.Cmd, ch ssh.Channel) uint32 {
	cmd.Stdout = ch
	cmd.Stderr = ch.Stderr()
	// A pipe rather than cmd.Stdin = ch: with the latter Wait would wait
	// for the client to close its side, which it does only after it has
	// seen the exit status.
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 1
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(ch.Stderr(), "gitserver: %v\n", err)
		return 1
	}
	go func() {
		_, _ = io.Copy(stdin, ch)
		_ = stdin.Close()
	}()
	if err := cmd.Wait(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return uint32(exit.ExitCode())
		}
		return 1
	}
	return 0
}

func sendExitStatus(ch ssh.Channel, status uint32) {
	payload := binary.BigEndian.AppendUint32(nil, status)
	_, _ = ch.SendRequest("exit-status", false, payload)
}

func (srv *sshServer) stop() error {
	srv.mu.Lock()
	srv.closed.Store(true)
	err := srv.listener.Close()
	for conn := range srv.conns {
		_ = conn.Close()
	}
	srv.mu.Unlock()
	srv.wg.Wait()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("stop ssh git server: %w", err)
	}
	return nil
}
