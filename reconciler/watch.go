package reconciler

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/capstan-dev/capstan/sources"
)

// WatchedSource is a source that reports its own changes, such as a local
// directory under fsnotify: it need not be polled.
type WatchedSource interface {
	sources.Source
	// Watch reports on Changes until ctx ends.
	Watch(ctx context.Context) error
	// Changes receives once per burst of changes to the revision.
	Changes() <-chan struct{}
}

// sourceWatcher turns each change of a watched root source into what a
// push does for git: a sync of the root and a reconcile of every
// deployment that reads the root, at once.
type sourceWatcher struct {
	source      WatchedSource
	trigger     *pushTrigger
	url, branch string
}

// Start watches until ctx ends.
func (w *sourceWatcher) Start(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- w.source.Watch(ctx) }()
	logger := log.FromContext(ctx).WithName("source-watch")
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			if ctx.Err() != nil {
				return nil
			}
			// Polling still works without the watch; say so and go on.
			logger.Error(err, "watching the root source failed; falling back to polling", "url", w.url)
			return nil
		case <-w.source.Changes():
			logger.Info("root source changed, reconciling now", "url", w.url)
			w.trigger.Trigger(ctx, w.url, w.branch)
		}
	}
}

// NeedLeaderElection makes only the leader react to changes.
func (w *sourceWatcher) NeedLeaderElection() bool { return true }
