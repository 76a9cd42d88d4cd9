package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// logTailLines is how much of a binary's log a start-up error quotes.
const logTailLines = 30

// stopGrace is how long a process may take to exit after SIGTERM before it
// is killed.
const stopGrace = 20 * time.Second

// pollInterval is how often readiness endpoints are polled.
const pollInterval = 50 * time.Millisecond

// errAddrInUse marks a start-up failure caused by a port that was taken
// between choosing it and binding it, which is worth retrying on other ports.
var errAddrInUse = errors.New("address already in use")

// process is one running control-plane binary with its log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File

	done    chan struct{} // closed when the process has exited
	waitErr error         // set before done is closed

	stopOnce sync.Once
	stopErr  error
}

// startProcess starts bin with args, sending stdout and stderr to
// <dir>/<name>.log, which a retry on other ports overwrites. env is added
// to the test process's environment. The process
// outlives ctx: ctx only bounds the start.
func startProcess(ctx context.Context, dir, name, bin string, args []string, env ...string) (*process, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("start %s: open log: %w", name, err)
	}
	// Not exec.CommandContext: the process must keep running after Start's
	// context is done, until Stop.
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, logFile: logFile, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		p.logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has exited.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// pid returns the process id.
func (p *process) pid() int { return p.cmd.Process.Pid }

// stop sends SIGTERM, waits up to stopGrace and then kills the process. It
// is safe to call more than once. It returns an error with the log's tail if
// the process had exited before.
func (p *process) stop() error {
	p.stopOnce.Do(func() {
		if p.exited() {
			// A control plane that died under the tests explains their
			// failures; say so instead of stopping quietly.
			p.stopErr = p.failure("stop", errors.New("exited before Stop"))
			return
		}
		if err := p.cmd.Process.Signal(stopSignal); err != nil && !p.exited() {
			p.stopErr = fmt.Errorf("stop %s: signal: %w", p.name, err)
		}
		timer := time.NewTimer(stopGrace)
		defer timer.Stop()
		select {
		case <-p.done:
			return
		case <-timer.C:
		}
		if err := p.cmd.Process.Kill(); err != nil && !p.exited() {
			p.stopErr = errors.Join(p.stopErr, fmt.Errorf("stop %s: kill: %w", p.name, err))
		}
		<-p.done
		p.stopErr = errors.Join(p.stopErr, fmt.Errorf("stop %s: did not exit within %s of SIGTERM, killed", p.name, stopGrace))
	})
	return p.stopErr
}

// kill ends the process at once, as a crash would, and waits until it
// has exited. After kill, stop does nothing.
func (p *process) kill() error {
	p.stopOnce.Do(func() {
		if err := p.cmd.Process.Kill(); err != nil && !p.exited() {
			p.stopErr = fmt.Errorf("kill %s: %w", p.name, err)
		}
		<-p.done
	})
	return p.stopErr
}

// failure builds a start-up error for the process: what went wrong, how the
// process ended if it did, and the tail of its log. It wraps errAddrInUse
// when the log says a port was taken.
func (p *process) failure(what string, cause error) error {
	tail := tailFile(p.logPath, logTailLines)
	var errs []error
	if cause != nil {
		errs = append(errs, cause)
	}
	if p.exited() {
		errs = append(errs, fmt.Errorf("%s exited: %v", p.name, p.waitErr))
	}
	if strings.Contains(tail, "address already in use") {
		errs = append(errs, errAddrInUse)
	}
	return fmt.Errorf("%s %s: %w\n--- last %d lines of %s ---\n%s", what, p.name, errors.Join(errs...), logTailLines, p.logPath, tail)
}

// waitUntil calls ready every pollInterval until it returns true, the
// process exits or ctx is done. The last error from ready is reported
// when waiting fails.
func (p *process) waitUntil(ctx context.Context, ready func(context.Context) (bool, error)) error {
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	var last error
	for {
		ok, err := ready(ctx)
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-p.done:
			return p.failure("wait for", last)
		case <-ctx.Done():
			return p.failure("wait for", errors.Join(ctx.Err(), last))
		case <-ticker.C:
		}
	}
}

// tailFile returns the last n lines of the file at path, or a note saying
// why it could not be read.
func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	defer f.Close()
	// Logs of a failed start are small; reading only the last 64 KiB keeps a
	// long-running process's log from being read whole.
	const maxRead = 64 << 10
	if st, err := f.Stat(); err == nil && st.Size() > maxRead {
		if _, err := f.Seek(st.Size()-maxRead, io.SeekStart); err != nil {
			return fmt.Sprintf("(cannot read log: %v)", err)
		}
	}
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
