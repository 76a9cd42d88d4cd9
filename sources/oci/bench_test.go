package oci

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkRevisionUnchanged measures one poll of an unchanged tag against
// a real registry on loopback, and reports the HTTP requests it costs.
//
//	go test -run '^$' -bench RevisionUnchanged ./sources/oci/
func BenchmarkRevisionUnchanged(b *testing.B) {
	ctx := context.Background()
	reg := newTestRegistry(b, "", "")
	url := reg.URL("clusters/east")
	push(b, ctx, url, "latest", overlay(1))
	for _, ref := range []Ref{{Tag: "latest"}, {SemVer: ">=1.0.0"}} {
		if ref.SemVer != "" {
			push(b, ctx, url, "1.0.0", overlay(1))
		}
		name := "tag"
		if ref.SemVer != "" {
			name = "semver"
		}
		b.Run(name, func(b *testing.B) {
			s := newSource(b, Options{URL: url, Ref: ref})
			if _, err := s.Revision(ctx); err != nil { // authenticates once
				b.Fatal(err)
			}
			reg.take()
			b.ResetTimer()
			for b.Loop() {
				if _, err := s.Revision(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(len(reg.take()))/float64(b.N), "requests/poll")
		})
	}
}

// BenchmarkPushToRevision measures the latency from `capstan push artifact`
// (Push) returning to a poller seeing the new revision, for a poller that
// polls every second as a deployment with interval 1s does. Pushes land at
// random points of the period, so the figure is dominated by the wait for
// the next tick (0.5 s on average); ns/op includes that random delay too.
//
//	go test -run '^$' -bench PushToRevision -benchtime 10x ./sources/oci/
func BenchmarkPushToRevision(b *testing.B) {
	ctx := context.Background()
	reg := newTestRegistry(b, "", "")
	url := reg.URL("clusters/east")
	push(b, ctx, url, "latest", overlay(0))
	s := newSource(b, Options{URL: url})
	last, err := s.Revision(ctx)
	if err != nil {
		b.Fatal(err)
	}
	seen := make(chan string)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		cur := last
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			rev, err := s.Revision(ctx)
			if err == nil && rev != cur {
				cur = rev
				select {
				case seen <- rev:
				case <-stop:
					return
				}
			}
		}
	}()
	i := 0
	var total time.Duration
	for b.Loop() {
		i++
		// Push at a random point of the poll period, as a user would.
		time.Sleep(time.Duration(rand.Int64N(int64(time.Second))))
		want := push(b, ctx, url, "latest", overlay(i))
		start := time.Now()
		if got := <-seen; got != want {
			b.Fatalf("poller saw %q, want %q", got, want)
		}
		total += time.Since(start)
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(i), "ms/push-to-revision")

}
