package pivot

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
)

// The fencing record on a real API server: the first writer claims it,
// the holder passes, anyone else is refused with the holder named, a
// namespace that does not exist needs none, and a handover moves it once
// however often it is repeated.
func TestFence(t *testing.T) {
	ctx := context.Background()
	c, _ := clients(t)
	ns := "fence-" + rand.String(5)
	if err := CheckFence(ctx, c, ns, "mgmt", "bootstrap-id", "bootstrap"); err != nil {
		t.Fatalf("no namespace, no record: %v; want nil", err)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	if holder, err := FenceHolder(ctx, c, ns, "mgmt"); err != nil || holder != "" {
		t.Fatalf("FenceHolder before anyone wrote = %q, %v; want none", holder, err)
	}

	if err := CheckFence(ctx, c, ns, "mgmt", "bootstrap-id", "bootstrap"); err != nil {
		t.Fatalf("first writer: %v; want it to claim the record", err)
	}
	if err := CheckFence(ctx, c, ns, "mgmt", "bootstrap-id", "bootstrap"); err != nil {
		t.Fatalf("the holder again: %v", err)
	}
	err := CheckFence(ctx, c, ns, "mgmt", "other-id", "other")
	if !IsFenced(err) || !strings.Contains(err.Error(), "bootstrap (bootstrap-id)") || !strings.Contains(err.Error(), "Lease "+ns+"/capstan-owner.mgmt") {
		t.Fatalf("another writer: %v; want fenced, naming the holder and the Lease", err)
	}
	if err := CheckFence(ctx, c, ns, "other-deployment", "other-id", "other"); err != nil {
		t.Fatalf("another deployment's record is its own: %v", err)
	}

	for range 2 { // a resumed move hands it over again
		if err := HandFence(ctx, c, ns, "mgmt", "target-id", "target"); err != nil {
			t.Fatalf("hand over: %v", err)
		}
	}
	if holder, err := FenceHolder(ctx, c, ns, "mgmt"); err != nil || holder != "target-id" {
		t.Fatalf("holder after the handover = %q, %v; want target-id", holder, err)
	}
	err = CheckFence(ctx, c, ns, "mgmt", "bootstrap-id", "bootstrap")
	var f *FencedError
	if !IsFenced(err) || !asFenced(err, &f) || f.Generation != 1 || f.Holder != "target-id" {
		t.Fatalf("the old owner after the handover: %v; want fenced by target-id at handover 1", err)
	}
	if err := CheckFence(ctx, c, ns, "mgmt", "target-id", "target"); err != nil {
		t.Fatalf("the new owner: %v", err)
	}
	// Handing over where nobody claimed yet creates the namespace and the
	// record.
	fresh := "fence-" + rand.String(5)
	if err := HandFence(ctx, c, fresh, "mgmt", "target-id", "target"); err != nil {
		t.Fatal(err)
	}
	if holder, _ := FenceHolder(ctx, c, fresh, "mgmt"); holder != "target-id" {
		t.Fatalf("holder of a record created by a handover = %q", holder)
	}
}

// ClaimFence decides as CheckFence does, creating the record first: a
// new deployment claims it, the holder passes, another writer is fenced
// (the record it found is read, not replaced), and a namespace that does
// not exist needs no record.
func TestClaimFence(t *testing.T) {
	ctx := context.Background()
	c, _ := clients(t)
	ns := "claim-" + rand.String(5)
	if err := ClaimFence(ctx, c, ns, "mgmt", "bootstrap-id", "bootstrap"); err != nil {
		t.Fatalf("no namespace, no record: %v; want nil", err)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	if err := ClaimFence(ctx, c, ns, "mgmt", "bootstrap-id", "bootstrap"); err != nil {
		t.Fatalf("first writer: %v; want it to claim the record", err)
	}
	if holder, err := FenceHolder(ctx, c, ns, "mgmt"); err != nil || holder != "bootstrap-id" {
		t.Fatalf("holder after the claim = %q, %v; want bootstrap-id", holder, err)
	}
	if err := ClaimFence(ctx, c, ns, "mgmt", "bootstrap-id", "bootstrap"); err != nil {
		t.Fatalf("the holder again: %v", err)
	}
	if err := ClaimFence(ctx, c, ns, "mgmt", "other-id", "other"); !IsFenced(err) {
		t.Fatalf("another writer: %v; want fenced", err)
	}
	if holder, _ := FenceHolder(ctx, c, ns, "mgmt"); holder != "bootstrap-id" {
		t.Fatalf("holder after another writer's claim = %q; want bootstrap-id still", holder)
	}
}

func asFenced(err error, f **FencedError) bool {
	fe, ok := err.(*FencedError)
	*f = fe
	return ok
}

func TestFenceNameIsADNSSubdomain(t *testing.T) {
	long := strings.Repeat("a", 253)
	if n := FenceName(long); len(n) > 253 || n == FenceName(long[:252]+"b") {
		t.Errorf("FenceName of a 253-character name: %d characters, or not unique", len(n))
	}
	if FenceName("mgmt") != "capstan-owner.mgmt" {
		t.Errorf("FenceName(mgmt) = %s", FenceName("mgmt"))
	}
}
