package reconciler

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/sources/webhook"
)

// WebhookOptions configure the push receiver. A provider whose secret is
// empty is off.
type WebhookOptions struct {
	// Addr is where the receiver listens, e.g. ":9292"; ":0" picks a port.
	Addr string
	// Secrets of the providers (see webhook.Options).
	GitHubSecret, GitLabToken, GiteaSecret, GenericToken []byte
}

// WebhookPath is where the receiver is mounted: POST /hook/github,
// /hook/gitlab, /hook/gitea, /hook/generic.
const WebhookPath = "/hook/"

// pushTrigger turns an authentic push into an immediate reconcile of every
// ClusterDeployment that follows the pushed branch, and a sync of the root
// source when it follows it. It reads deployments from the informer cache,
// so matching a push costs no API request.
type pushTrigger struct {
	client  client.Client
	root    *rootSource
	enqueue chan<- event.GenericEvent
	// elected is closed once this replica leads; a standby ignores pushes
	// (nothing would drain them), and the leader's poll catches up.
	elected <-chan struct{}
	// shard, when sharding, makes every replica take pushes: it forwards
	// those for deployments another replica owns (shard.go).
	shard *sharding
	// sources are told that a pushed branch moved, so that the
	// reconciles the push starts ask the remote rather than take a
	// revision another deployment got a moment ago.
	sources *sourceCache
	// logger is the daemon's: the webhook handler triggers from a
	// context of its own, which carries none.
	logger logr.Logger
}

var _ webhook.Trigger = (*pushTrigger)(nil)

func (p *pushTrigger) Match(repoURLs []string, branch string) (string, bool) {
	for _, f := range p.followed(context.Background()) {
		for _, u := range repoURLs {
			if webhook.SameRepository(u, f.url) && (branch == "" || branch == f.branch) {
				return u, true
			}
		}
	}
	return "", false
}

func (p *pushTrigger) Trigger(ctx context.Context, repoURL, branch string) {
	logger := p.logger
	if logger.GetSink() == nil {
		logger = log.FromContext(ctx)
	}
	logger = logger.WithName("webhook")
	ctx = log.IntoContext(ctx, logger) // for the shard's forward
	if p.elected != nil && p.shard == nil {
		select {
		case <-p.elected:
		default:
			logger.Info("push received by a standby replica; ignored, the leader's poll picks it up", "repository", repoURL, "branch", branch)
			return
		}
	}
	var pushed []followed
	for _, f := range p.followed(ctx) {
		if !webhook.SameRepository(repoURL, f.url) || (branch != "" && branch != f.branch) {
			continue
		}
		pushed = append(pushed, f)
		if f.deployment != nil {
			p.sources.expireFor(client.ObjectKeyFromObject(f.deployment))
		}
	}
	for _, f := range pushed {
		if f.deployment == nil {
			p.root.kickNow()
			continue
		}
		if p.shard.forward(ctx, p.client, f.deployment) {
			continue
		}
		select {
		case p.enqueue <- event.GenericEvent{Object: f.deployment}:
			logger.Info("push received, reconciling now", "clusterDeployment", f.deployment.Namespace+"/"+f.deployment.Name, "branch", f.branch)
		case <-ctx.Done():
			return
		}
	}
}

// followed is one (repository, branch) a deployment or the root follows.
type followed struct {
	url, branch string
	deployment  *capstanv1.ClusterDeployment // nil for the root source
}

func (p *pushTrigger) followed(ctx context.Context) []followed {
	var out []followed
	if p.root != nil {
		out = append(out, followed{url: p.root.opts.URL, branch: p.root.opts.Branch})
	}
	list := &capstanv1.ClusterDeploymentList{}
	if err := p.client.List(ctx, list); err != nil {
		return out
	}
	for i := range list.Items {
		cd := &list.Items[i]
		switch src := cd.Spec.Source; {
		case src != nil && src.Git != nil:
			branch := src.Git.Ref.Branch
			if branch == "" {
				branch = "main"
			}
			out = append(out, followed{url: src.Git.URL, branch: branch, deployment: cd})
		case src == nil && p.root != nil:
			out = append(out, followed{url: p.root.opts.URL, branch: p.root.opts.Branch, deployment: cd})
		}
	}
	return out
}

// webhookServer serves the push receiver until the manager stops.
type webhookServer struct {
	listener net.Listener
	handler  *webhook.Handler
}

func newWebhookServer(opts WebhookOptions, trigger webhook.Trigger) (*webhookServer, error) {
	h, err := webhook.NewHandler(webhook.Options{
		GitHubSecret: opts.GitHubSecret, GitLabToken: opts.GitLabToken,
		GiteaSecret: opts.GiteaSecret, GenericToken: opts.GenericToken,
		Trigger: trigger,
	})
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("listen for webhooks on %s: %w", opts.Addr, err)
	}
	return &webhookServer{listener: l, handler: h}, nil
}

// Start implements manager.Runnable.
func (s *webhookServer) Start(ctx context.Context) error {
	mux := http.NewServeMux()
	mux.Handle(WebhookPath, http.StripPrefix(WebhookPath[:len(WebhookPath)-1], s.handler))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(s.listener) }()
	select {
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		err := srv.Shutdown(shutdown)
		s.handler.Close()
		return err
	case err := <-errc:
		s.handler.Close()
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

// NeedLeaderElection is false: every replica may receive pushes; only the
// leader's reconciles act on them.
func (s *webhookServer) NeedLeaderElection() bool { return false }
