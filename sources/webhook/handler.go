package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// DefaultMaxBodyBytes is the default Options.MaxBodyBytes (1 MiB). Push
// payloads are a few KiB, up to a few hundred for pushes of many commits;
// the hosts truncate the commit list long before 1 MiB.
const DefaultMaxBodyBytes = 1 << 20

// Trigger is what the handler sets off. It is defined here, where it is
// used; the reconciler implements it over its sources.
type Trigger interface {
	// Match reports whether any source follows branch of the repository
	// the push names, by any of repoURLs (its clone, ssh and web URLs), and
	// returns the URL to trigger. It runs in the request, so it must be
	// cheap. SameRepository compares URLs the way users expect. branch is
	// empty for a generic push that names none: any branch matches.
	Match(repoURLs []string, branch string) (repoURL string, ok bool)
	// Trigger asks for an immediate fetch of the sources that follow
	// branch of repoURL. Calls come from one goroutine, one at a time, so
	// Trigger should hand the work over (enqueue a reconcile) and return.
	Trigger(ctx context.Context, repoURL, branch string)
}

// Options configure a Handler. A provider whose secret is empty is off.
type Options struct {
	// GitHubSecret is the secret of GitHub's webhook (HMAC-SHA256).
	GitHubSecret []byte
	// GitLabToken is the secret token of GitLab's webhook.
	GitLabToken []byte
	// GiteaSecret is the secret of Gitea's (or Forgejo's) webhook
	// (HMAC-SHA256).
	GiteaSecret []byte
	// GenericToken is the bearer token of the generic endpoint.
	GenericToken []byte
	// Trigger is told about authentic pushes for watched branches.
	Trigger Trigger
	// MaxBodyBytes bounds a request body; DefaultMaxBodyBytes when zero.
	MaxBodyBytes int64
}

// Handler receives push events. Create it with NewHandler, stop it with
// Close.
type Handler struct {
	opts Options
	mux  *http.ServeMux
	d    *dispatcher
}

var _ http.Handler = (*Handler)(nil)

// NewHandler returns a Handler and starts the goroutine that calls
// opts.Trigger.
func NewHandler(opts Options) (*Handler, error) {
	if opts.Trigger == nil {
		return nil, errors.New("webhook: Options.Trigger is nil")
	}
	if len(opts.GitHubSecret)+len(opts.GitLabToken)+len(opts.GiteaSecret)+len(opts.GenericToken) == 0 {
		return nil, errors.New("webhook: no provider has a secret; set at least one of the GitHub, GitLab, Gitea or generic secrets")
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	h := &Handler{opts: opts, mux: http.NewServeMux(), d: newDispatcher(opts.Trigger)}
	for name, p := range providers {
		h.mux.HandleFunc("POST /"+name, func(w http.ResponseWriter, r *http.Request) { h.serve(w, r, p) })
	}
	return h, nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mux.ServeHTTP(w, r)
}

// Close stops calling the Trigger and waits for a call in progress to
// return. Requests after Close get 503.
func (h *Handler) Close() {
	h.d.close()
}

// response is the JSON body of every answer.
type response struct {
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
	Repo   string `json:"repository,omitempty"`
	Branch string `json:"branch,omitempty"`
}

func reply(w http.ResponseWriter, code int, resp response) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(resp)
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request, p provider) {
	secret := p.secret(h.opts)
	if len(secret) == 0 {
		reply(w, http.StatusNotFound, response{Status: "disabled", Reason: p.name + " webhooks are not enabled on this Capstan"})
		return
	}
	if r.ContentLength > h.opts.MaxBodyBytes {
		reply(w, http.StatusRequestEntityTooLarge, response{Status: "refused", Reason: fmt.Sprintf("body over %d bytes", h.opts.MaxBodyBytes)})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opts.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			reply(w, http.StatusRequestEntityTooLarge, response{Status: "refused", Reason: fmt.Sprintf("body over %d bytes", h.opts.MaxBodyBytes)})
			return
		}
		reply(w, http.StatusBadRequest, response{Status: "refused", Reason: "read body: " + err.Error()})
		return
	}
	// Authenticate before parsing: an unauthenticated body is not even
	// looked at.
	if err := p.verify(r.Header, body, secret); err != nil {
		reply(w, http.StatusUnauthorized, response{Status: "refused", Reason: err.Error()})
		return
	}
	ev, err := p.parse(r.Header, body)
	if err != nil {
		reply(w, http.StatusBadRequest, response{Status: "refused", Reason: err.Error()})
		return
	}
	switch {
	case ev.pong:
		reply(w, http.StatusOK, response{Status: "pong"})
		return
	case ev.ignore != "":
		reply(w, http.StatusAccepted, response{Status: "ignored", Reason: ev.ignore})
		return
	}
	repo, ok := h.opts.Trigger.Match(ev.urls, ev.branch)
	if !ok {
		reply(w, http.StatusAccepted, response{Status: "ignored", Reason: "no source follows this repository and branch",
			Repo: first(ev.urls), Branch: ev.branch})
		return
	}
	if !h.d.enqueue(repo, ev.branch) {
		reply(w, http.StatusServiceUnavailable, response{Status: "refused", Reason: "shutting down"})
		return
	}
	reply(w, http.StatusAccepted, response{Status: "triggered", Repo: repo, Branch: ev.branch})
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// key identifies the sources one trigger call is for.
type key struct{ repo, branch string }

// dispatcher calls the Trigger from one goroutine, merging requests for a
// key that is already pending into one.
type dispatcher struct {
	trigger Trigger
	ctx     context.Context
	cancel  context.CancelFunc
	wake    chan struct{}
	done    chan struct{}

	mu      sync.Mutex
	pending []key
	queued  map[key]bool
	closed  bool
}

func newDispatcher(t Trigger) *dispatcher {
	ctx, cancel := context.WithCancel(context.Background())
	d := &dispatcher{trigger: t, ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1), done: make(chan struct{}), queued: map[key]bool{}}
	go d.run()
	return d
}

// enqueue asks for one trigger of (repo, branch), unless one is pending
// already. It reports false once the dispatcher is closed.
func (d *dispatcher) enqueue(repo, branch string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	k := key{repo, branch}
	if !d.queued[k] {
		d.queued[k] = true
		d.pending = append(d.pending, k)
	}
	select {
	case d.wake <- struct{}{}:
	default:
	}
	return true
}

func (d *dispatcher) run() {
	defer close(d.done)
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-d.wake:
		}
		for {
			d.mu.Lock()
			if len(d.pending) == 0 {
				d.mu.Unlock()
				break
			}
			k := d.pending[0]
			d.pending = d.pending[1:]
			delete(d.queued, k)
			d.mu.Unlock()
			if d.ctx.Err() != nil {
				return
			}
			d.trigger.Trigger(d.ctx, k.repo, k.branch)
		}
	}
}

func (d *dispatcher) close() {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.cancel()
	<-d.done
}
