package gitserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// daemon is a running `git daemon`.
type daemon struct {
	cmd    *exec.Cmd
	url    string
	done   chan struct{}
	stderr *bytes.Buffer
}

// StartDaemon starts `git daemon` serving the server's repositories over
// git:// on a free port of 127.0.0.1 and returns its base URL, e.g.
// "git://127.0.0.1:40123"; GitURL gives a repository's URL. ctx bounds the
// start only; Close stops the daemon. Calling it again returns the running
// daemon's URL.
func (s *Server) StartDaemon(ctx context.Context) (string, error) {
	if s.daemon != nil {
		return s.daemon.url, nil
	}
	port, err := freePort()
	if err != nil {
		return "", fmt.Errorf("start git daemon: %w", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cmd := exec.Command("git", "daemon",
		"--export-all", "--reuseaddr", "--informative-errors",
		"--base-path="+s.dir, "--listen=127.0.0.1", "--port="+strconv.Itoa(port), s.dir)
	cmd.Dir = s.dir
	cmd.Env = s.gitEnv
	// Its own process group, so that Close also ends the upload-pack
	// children the daemon forks per connection.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	d := &daemon{cmd: cmd, url: "git://" + addr, done: make(chan struct{}), stderr: &bytes.Buffer{}}
	cmd.Stderr = io.MultiWriter(d.stderr, s.opts.Stderr)
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start git daemon: %w", err)
	}
	go func() { _ = cmd.Wait(); close(d.done) }()

	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = conn.Close()
			s.daemon = d
			return d.url, nil
		}
		select {
		case <-d.done:
			return "", fmt.Errorf("start git daemon on %s: it exited: %s", addr, d.stderr.String())
		case <-ctx.Done():
			_ = d.stop()
			return "", fmt.Errorf("start git daemon on %s: %w", addr, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// GitURL returns the git:// URL of repository name; it is empty until
// StartDaemon has succeeded.
func (s *Server) GitURL(name string) string {
	if s.daemon == nil {
		return ""
	}
	return s.daemon.url + "/" + repoName(name)
}

func (d *daemon) stop() error {
	select {
	case <-d.done:
		return nil
	default:
	}
	if err := syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop git daemon: %w", err)
	}
	<-d.done
	return nil
}

// freePort asks the kernel for a free port on 127.0.0.1. Another process
// could take it before the caller binds it; on loopback in a test that is
// rare enough to accept.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
