//go:build linux

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
)

// buildCapstan builds the capstan binary into dir.
func buildCapstan(dir string) (string, error) {
	bin := filepath.Join(dir, "capstan")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/capstan-dev/capstan/cmd/capstan").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/capstan: %w\n%s", err, out)
	}
	return bin, nil
}

// openPTY opens a pseudo-terminal of cols x rows: the controlling side
// (master) for the test, the terminal (slave) for the program.
func openPTY(cols, rows uint16) (master, tty *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	fd := int(master.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("unlock pty: %w", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("pty number: %w", err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	if err := unix.IoctlSetWinsize(int(tty.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows}); err != nil {
		master.Close()
		tty.Close()
		return nil, nil, fmt.Errorf("set pty size: %w", err)
	}
	return master, tty, nil
}

// screen collects what a program writes to its terminal.
type screen struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

const clearScreen = "\x1b[H\x1b[2J"

var ansiCodes = regexp.MustCompile(`\x1b\[[0-9;]*[A-Za-z]`)

// frames splits the output into the screens drawn after each clear, with
// colour and carriage returns removed.
func (s *screen) frames() []string {
	parts := strings.Split(s.String(), clearScreen)
	var out []string
	for _, p := range parts[1:] {
		out = append(out, strings.ReplaceAll(ansiCodes.ReplaceAllString(p, ""), "\r", ""))
	}
	return out
}

// `capstan status --watch` in a real terminal draws a deployment's stages
// in colour and redraws them in place when the daemon moves a stage on.
func TestStatusWatchRedrawsInATerminal(t *testing.T) {
	bin, err := buildCapstan(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, twoStageFiles("1"), "two-stage overlay"); err != nil {
		t.Fatal(err)
	}
	startDaemon(t, nil)
	createDeployment(t, c, ns, "watched", twoStageSpec(url, ns, gitSecret(t, c, ns)))
	waitDeployment(t, c, ns, "watched", "stage Infra in progress", func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "Infra").State == capstanv1.StageInProgress
	})

	master, tty, err := openPTY(120, 40)
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	cmd := exec.Command(bin, "status", "watched", "-n", ns, "--watch", "--kubeconfig", env.KubeconfigPath)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.Env = append(os.Environ(), "TERM=xterm-256color", "NO_COLOR=")
	// Its own session with the pty as controlling terminal: Ctrl-C typed
	// there interrupts it, as in a shell.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	var out screen
	go func() { _, _ = master.WriteTo(&out) }() // ends with EIO when the program exits

	lastFrame := func() string {
		f := out.frames()
		if len(f) == 0 {
			return ""
		}
		return f[len(f)-1]
	}
	waitFor(t, "a frame with stage Infra in progress", func() (bool, error) {
		f := lastFrame()
		return strings.Contains(f, ns+"/watched") && regexp.MustCompile(`(?m)^Infra +InProgress`).MatchString(f),
			fmt.Errorf("screen: %q", out.String())
	})
	before := len(out.frames())
	if !strings.Contains(out.String(), "\x1b[33m") {
		t.Errorf("no colour on a terminal: %q", out.String())
	}

	setWidgetReady(t, c, ns, "infra")
	waitFor(t, "a redrawn frame with every stage Ready", func() (bool, error) {
		f := lastFrame()
		return regexp.MustCompile(`(?m)/watched +Ready`).MatchString(f) &&
				strings.Contains(f, "2/2 stages ready") &&
				regexp.MustCompile(`(?m)^Infra +Ready`).MatchString(f) &&
				regexp.MustCompile(`(?m)^App +Ready`).MatchString(f),
			fmt.Errorf("last frame: %q", f)
	})
	if after := len(out.frames()); after <= before {
		t.Errorf("%d frames before the change, %d after: no redraw", before, after)
	}
	for i, line := range strings.Split(lastFrame(), "\n") {
		if n := utf8.RuneCountInString(line); n > 120 {
			t.Errorf("line %d is %d columns on a 120-column terminal: %q", i+1, n, line)
		}
	}

	// Ctrl-C ends the watch cleanly.
	if _, err := master.Write([]byte{3}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("capstan status --watch after Ctrl-C: %v, want exit 0\n%s", err, out.String())
		}
	case <-time.After(waitTimeout):
		t.Fatalf("capstan status --watch still running %s after Ctrl-C", waitTimeout)
	}

	// Not a terminal: no colour. -o json for scripts.
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, append(args, "--kubeconfig", env.KubeconfigPath)...).CombinedOutput()
		if err != nil {
			t.Fatalf("capstan %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		if bytes.Contains(out, []byte("\x1b[")) {
			t.Errorf("capstan %s printed colour codes to a pipe: %q", strings.Join(args, " "), out)
		}
		return string(out)
	}
	// A pipe gets 80 columns ($COLUMNS, when exported, would say otherwise).
	t.Setenv("COLUMNS", "")
	for i, line := range strings.Split(strings.TrimSuffix(run("status", "watched", "-n", ns), "\n"), "\n") {
		if n := utf8.RuneCountInString(line); n > 80 {
			t.Errorf("line %d is %d columns to a pipe, over 80: %q", i+1, n, line)
		}
	}
	var summaries []struct {
		Phase       string `json:"phase"`
		StagesReady int    `json:"stagesReady"`
	}
	if err := json.Unmarshal([]byte(run("status", "watched", "-n", ns, "-o", "json")), &summaries); err != nil {
		t.Fatal(err)
	}
	if len(summaries) != 1 || summaries[0].Phase != "Ready" || summaries[0].StagesReady != 2 {
		t.Errorf("status -o json = %+v, want one Ready deployment with 2 stages ready", summaries)
	}

	// The stage events, oldest first: Infra starts before it is ready,
	// before the deployment is; App, ready as soon as it was applied, is
	// told by the deployment's Ready event (its note, cut to the
	// terminal's width here).
	waitFor(t, "capstan events to list the stage transitions in order", func() (bool, error) {
		events := run("events", "watched", "-n", ns)
		order := []string{"stage Infra started", "stage Infra ready", "all 2 stages ready"}
		at := -1
		for _, want := range order {
			i := strings.Index(events, want)
			if i < 0 || i < at {
				return false, fmt.Errorf("%q out of order or missing in:\n%s", want, events)
			}
			at = i
		}
		t.Logf("capstan events:\n%s", events)
		return true, nil
	})
}
