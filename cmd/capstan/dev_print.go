package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// devPrinter writes the demo's progress: one line per step and per stage
// transition, with the time since start, readable in a log as on a
// terminal.
type devPrinter struct {
	out   io.Writer
	begin time.Time
	// started and took are what the printer saw of each stage: status
	// times have whole seconds, too coarse for stages of a second or two.
	started map[string]time.Time
	took    map[string]time.Duration
}

func (p *devPrinter) stamp() string {
	return fmt.Sprintf("[%6.1fs]", time.Since(p.begin).Seconds())
}

// step prints one step; the lines of a message of several (all the
// problems a preflight found) line up under the first.
func (p *devPrinter) step(format string, args ...any) {
	msg := strings.TrimRight(fmt.Sprintf(format, args...), "\n")
	fmt.Fprintf(p.out, "%s ▸ %s\n", p.stamp(), strings.ReplaceAll(msg, "\n", "\n"+devContinue))
}

// devContinue lines a step's later lines up under its first.
const devContinue = "            "

// lines prints a step and the lines that go with it (commands to copy).
func (p *devPrinter) lines(lines []string) {
	if len(lines) > 0 {
		p.step("%s", strings.Join(lines, "\n"))
	}
}

func (p *devPrinter) detail(format string, args ...any) {
	fmt.Fprintf(p.out, "%s     %s\n", p.stamp(), fmt.Sprintf(format, args...))
}

// transitions prints the stages whose state or message changed since the
// last look.
func (p *devPrinter) transitions(prefix string, cd *capstanv1.ClusterDeployment, seen map[string]string) {
	if prefix != "" {
		prefix += " "
	}
	for _, st := range cd.Status.Stages {
		key := string(st.State) + "\x00" + st.Message
		if st.State == capstanv1.StageReady {
			// Once Ready, a new message is no new transition.
			key = string(st.State)
		}
		if seen[st.Name] == key || st.State == capstanv1.StagePending {
			continue
		}
		seen[st.Name] = key
		if p.started == nil {
			p.started, p.took = map[string]time.Time{}, map[string]time.Duration{}
		}
		key2 := cd.Name + "/" + st.Name
		if _, ok := p.started[key2]; !ok {
			p.started[key2] = time.Now()
		}
		switch st.State {
		case capstanv1.StageReady:
			p.took[key2] = time.Since(p.started[key2])
			delete(p.started, key2)
			fmt.Fprintf(p.out, "%s   ✓ %s%-24s ready in %s\n", p.stamp(), prefix, st.Name, p.took[key2].Round(100*time.Millisecond))
		default:
			msg := oneLine(strings.TrimSpace(st.Message))
			if msg == "" {
				msg = fmt.Sprintf("started (attempt %d)", st.Attempts)
			}
			fmt.Fprintf(p.out, "%s   … %s%-24s %s\n", p.stamp(), prefix, st.Name, msg)
		}
	}
}

// restart forgets when the stages of a deployment started: a new
// revision walks them again, and each is timed from its new start.
func (p *devPrinter) restart(name string) {
	for key := range p.started {
		if strings.HasPrefix(key, name+"/") {
			delete(p.started, key)
		}
	}
}

// summary prints each stage's duration, as the printer saw it (to 0.2 s),
// once the deployment is Ready.
func (p *devPrinter) summary(prefix string, cd *capstanv1.ClusterDeployment) {
	title := "STAGE"
	if prefix != "" {
		title = strings.ToUpper(prefix) + " STAGE"
	}
	fmt.Fprintf(p.out, "\n  %-24s %10s %9s\n", title, "DURATION", "ATTEMPTS")
	var total time.Duration
	for _, st := range cd.Status.Stages {
		took := p.took[cd.Name+"/"+st.Name]
		total += took
		fmt.Fprintf(p.out, "  %-24s %10s %9d\n", st.Name, took.Round(100*time.Millisecond), st.Attempts)
	}
	fmt.Fprintf(p.out, "  %-24s %10s\n\n", "total", total.Round(100*time.Millisecond))
}

// indent prefixes every line written through it.
type indent struct {
	w      io.Writer
	prefix string
	mid    bool
}

func (i *indent) Write(b []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line == "" {
			continue
		}
		if !i.mid {
			if _, err := io.WriteString(i.w, i.prefix); err != nil {
				return 0, err
			}
		}
		if _, err := io.WriteString(i.w, line); err != nil {
			return 0, err
		}
		i.mid = !strings.HasSuffix(line, "\n")
	}
	return len(b), nil
}

// devOutput is where dev prints. A write that fails (stdout piped into
// head, which has exited) stops the run: nobody reads what it reports
// any more, and what it started must not outlive it. Later writes are
// dropped, so that stopping can finish.
type devOutput struct {
	mu     sync.Mutex
	w      io.Writer
	failed error
	cancel context.CancelFunc
}

// sigpipe makes a write to a closed pipe fail with EPIPE instead of
// killing the process: Go's runtime exits on SIGPIPE for stdout and
// stderr unless it is notified, and an exit then would skip the cleanup.
var sigpipe = sync.OnceFunc(func() { signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE) })

// newDevOutput wraps w; the context ends when a write to it fails.
func newDevOutput(ctx context.Context, w io.Writer) (context.Context, *devOutput) {
	sigpipe()
	ctx, cancel := context.WithCancel(ctx)
	return ctx, &devOutput{w: w, cancel: cancel}
}

func (o *devOutput) Write(b []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.failed != nil {
		return len(b), nil
	}
	if _, err := o.w.Write(b); err != nil {
		o.failed = err
		o.cancel()
	}
	return len(b), nil
}

// err says why the run stopped when its output failed; nil otherwise.
func (o *devOutput) err() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.failed == nil {
		return nil
	}
	return fmt.Errorf("stopped: the output cannot be written (%w); what it started is stopped and its files removed", o.failed)
}
