package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler"
)

// devPoll is how often the dev loop looks at the deployments.
const devPoll = 200 * time.Millisecond

// devFollower is what the dev loop follows: the deployments of one
// cluster (devWatch), or one deployment through a pivot (pivotWatch).
type devFollower interface {
	// look reads the deployments and prints what changed. Its error
	// ends the loop: something the demo needs could not start.
	look(ctx context.Context) error
	// done says every followed deployment is Ready.
	done() bool
	// stalled says which deployments are Stalled, and why; nil when none.
	stalled() error
	// stuckError says where the walk stands when --timeout passes.
	stuckError(cause error) error
}

// followOptions say when the dev loop ends by itself.
type followOptions struct {
	// exitWhenReady ends it once done (nil) or at the first stall (the
	// stall); without it only ctx or a component that stops end it.
	exitWhenReady bool
	// ready is called the first time every deployment is Ready.
	ready func()
}

// follow looks every devPoll until ctx ends, a component stops (its error
// from errc), or, with exitWhenReady, the deployments are Ready or one
// stalls. A stall is printed and followed otherwise: the next push or
// edit can fix it. When ctx ends it returns nil, or with exitWhenReady
// the stuck stage (ctx carries --timeout).
func follow(ctx context.Context, w devFollower, errc <-chan error, o followOptions) error {
	tick := time.NewTicker(devPoll)
	defer tick.Stop()
	readySaid := false
	for {
		if err := w.look(ctx); err != nil {
			return err
		}
		if !readySaid && w.done() {
			readySaid = true
			if o.ready != nil {
				o.ready()
			}
			if o.exitWhenReady {
				return nil
			}
		}
		if o.exitWhenReady {
			if err := w.stalled(); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			if o.exitWhenReady {
				return w.stuckError(ctx.Err())
			}
			return nil
		case err := <-errc:
			return err
		case <-tick.C:
		}
	}
}

// devWatch prints the stage transitions of the demo's deployments, each
// one's Ready or Stalled, and the root source's errors.
type devWatch struct {
	c    client.Client
	p    *devPrinter
	only string // one deployment's name, or "" for all
	root rootWatch

	tracked map[string]*devTracked
}

var _ devFollower = (*devWatch)(nil)

// devTracked is what the watch last printed of one deployment.
type devTracked struct {
	seen map[string]string // stage -> state and message printed
	rev  string
	gen  int64
	said string // "ready", or the Stalled message, printed at rev, gen
	last *capstanv1.ClusterDeployment
}

func (t *devTracked) ready() bool {
	return isDeploymentReady(t.last) && t.last.Status.Revision == t.rev
}

func (w *devWatch) names() string {
	names := make([]string, 0, len(w.tracked))
	for name := range w.tracked {
		names = append(names, name)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// look lists the deployments and prints what changed.
func (w *devWatch) look(ctx context.Context) error {
	w.root.look(w.p)
	list := &capstanv1.ClusterDeploymentList{}
	if err := w.c.List(ctx, list, client.InNamespace(devNamespace)); err != nil {
		return nil // the next tick tries again
	}
	if w.tracked == nil {
		w.tracked = map[string]*devTracked{}
	}
	for i := range list.Items {
		cd := &list.Items[i]
		if w.only != "" && cd.Name != w.only {
			continue
		}
		t := w.tracked[cd.Name]
		if t == nil {
			t = &devTracked{seen: map[string]string{}, rev: cd.Status.Revision, gen: cd.Generation}
			w.tracked[cd.Name] = t
		}
		t.last = cd
		if cd.Status.Revision != t.rev || cd.Generation != t.gen {
			if t.rev != "" {
				w.p.step("%s: new revision %s, walking the stages again", cd.Name, formatRevision(cd.Status.Revision))
			}
			t.rev, t.gen, t.said = cd.Status.Revision, cd.Generation, ""
			clear(t.seen)
			w.p.restart(cd.Name)
		}
		prefix := ""
		if w.only == "" {
			prefix = cd.Name
		}
		w.p.transitions(prefix, cd, t.seen)
		switch msg := stalledMessage(cd); {
		case t.ready() && t.said != "ready":
			t.said = "ready"
			w.p.summary(prefix, cd)
			w.p.step("%s is Ready at %s", cd.Name, formatRevision(t.rev))
		case !t.ready() && msg != "" && t.said != msg:
			t.said = msg
			w.p.step("%s stalled at %s: %s\nstill following: fix the cause in the source, or Ctrl-C", cd.Name, formatRevision(t.rev), msg)
		}
	}
	return nil
}

func (w *devWatch) done() bool {
	for _, t := range w.tracked {
		if !t.ready() {
			return false
		}
	}
	return len(w.tracked) > 0
}

func (w *devWatch) stalled() error {
	var errs []error
	for _, name := range strings.Split(w.names(), ", ") {
		if t := w.tracked[name]; t != nil && !t.ready() {
			if msg := stalledMessage(t.last); msg != "" {
				errs = append(errs, fmt.Errorf("%s stalled: %s", name, msg))
			}
		}
	}
	return errors.Join(errs...)
}

// stalledMessage is the deployment's Stalled condition's message, "" when
// it is not Stalled.
func stalledMessage(cd *capstanv1.ClusterDeployment) string {
	if st := devCondition(cd, capstanv1.ConditionStalled); st != nil && st.Status == metav1.ConditionTrue {
		return st.Message
	}
	return ""
}

func (w *devWatch) stuckError(cause error) error {
	if errors.Is(cause, context.Canceled) {
		return cause
	}
	if len(w.tracked) == 0 {
		what := fmt.Sprintf("no ClusterDeployment appeared in %s: is one committed under --path?", devNamespace)
		if w.only != "" {
			what = fmt.Sprintf("%s/%s never appeared: is it committed under --path?", devNamespace, w.only)
		}
		return errors.Join(errors.New(what), w.root.err())
	}
	var stuck []error
	for _, name := range strings.Split(w.names(), ", ") {
		t := w.tracked[name]
		if t.ready() {
			continue
		}
		msg := name + " not Ready before the timeout"
		for _, st := range t.last.Status.Stages {
			if st.State != capstanv1.StageReady {
				msg = fmt.Sprintf("%s not Ready before the timeout: stage %s is %s: %s", name, st.Name, st.State, st.Message)
				break
			}
		}
		stuck = append(stuck, errors.New(msg))
	}
	return errors.Join(append(stuck, w.root.err())...)
}

// rootWatch prints the root source's error when it changes, and when it
// is gone.
type rootWatch struct {
	status func() reconciler.RootStatus // nil: no root source
	said   string
}

func (r *rootWatch) look(p *devPrinter) {
	if r.status == nil {
		return
	}
	st := r.status()
	msg := ""
	if st.Err != nil {
		msg = st.Err.Error()
	}
	if msg == r.said {
		return
	}
	switch {
	case msg != "":
		p.step("root source: %s\nstill following: fix the file, or Ctrl-C", msg)
	case r.said != "":
		p.step("root source: applied %d ClusterDeployments at %s", st.Deployments, formatRevision(st.Revision))
	}
	r.said = msg
}

// err is the root source's last error, wrapped to say where it came from.
func (r *rootWatch) err() error {
	if r.status == nil {
		return nil
	}
	if err := r.status().Err; err != nil {
		return fmt.Errorf("root source: %w", err)
	}
	return nil
}

// ensureDevNamespace creates the namespace the demo's deployments live in.
func ensureDevNamespace(ctx context.Context, c client.Client) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: devNamespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", devNamespace, err)
	}
	return nil
}

func isDeploymentReady(cd *capstanv1.ClusterDeployment) bool {
	c := devCondition(cd, capstanv1.ConditionReady)
	return c != nil && c.Status == metav1.ConditionTrue && cd.Status.ObservedGeneration == cd.Generation
}

func devCondition(cd *capstanv1.ClusterDeployment, typ string) *metav1.Condition {
	for i := range cd.Status.Conditions {
		if cd.Status.Conditions[i].Type == typ {
			return &cd.Status.Conditions[i]
		}
	}
	return nil
}
