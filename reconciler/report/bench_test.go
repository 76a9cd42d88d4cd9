package report

import (
	"testing"
	"time"

	"github.com/capstan-dev/capstan/sources/git"
)

// BenchmarkNotify is what the reconciler pays per status write of a
// reporting deployment (15 stages, 1,000 inventory entries): trim, render,
// hash, queue. Run: go test ./reconciler/report -run x -bench Notify -benchmem
func BenchmarkNotify(b *testing.B) {
	r, err := New(Options{Root: &Root{URL: "https://git.example/infra.git", Branch: "main", StatusBranch: "capstan/status", Namespaces: []string{"fleet"}, Auth: git.Auth{}}}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	cd := deployment("east", 7)
	cd.Status.Stages = cd.Status.Stages[:15]
	cd.Status.Inventory = walking().Status.Inventory
	for range 1000 {
		cd.Status.Inventory.Stages[0].Entries = append(cd.Status.Inventory.Stages[0].Entries, cd.Status.Inventory.Stages[0].Entries[0])
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		cd.Status.Stages[7].Attempts = int32(i) // a new status each time
		r.Notify(cd)
	}
}

// BenchmarkPush is one status commit of one file to a local git server
// over http: list, shallow fetch, commit, push.
// Run: go test ./reconciler/report -run x -bench Push
func BenchmarkPush(b *testing.B) {
	ctx := b.Context()
	name := "bench-push"
	if _, err := server.CreateRepo(name); err != nil {
		b.Fatal(err)
	}
	if _, err := server.Commit(name, "main", map[string]string{"a": "a\n"}, "initial"); err != nil {
		b.Fatal(err)
	}
	for i := 0; b.Loop(); i++ {
		req := httpPush(name, map[string]string{"status/ns/a.yaml": "attempt: " + time.Now().String() + "\n"})
		if _, err := push(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
