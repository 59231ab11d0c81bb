package lease

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/record"
)

// A held slot deleted (an operator's `kubectl delete lease`) or taken by
// another writer: the holder makes a deleted slot again for itself at once
// and goes on; a slot another holds stops it before its next step (Check);
// a waiting node does not take a slot deleted or cleared while its last
// holder's Node is mid-change.

func TestDeletedSlotMadeAgainForItsHolder(t *testing.T) {
	ctx := context.Background()
	c, clk := versionedFake()
	slot, err := acquireStepping(t, clk, newSlots(c, clk, "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer slot.Release(false)
	h := slot.(*slotHold)
	waitUntil(t, "the watch never showed the take", func() bool { return h.s.cached(h.store, SlotLeaseName(0)) != nil })
	clk.Step(2 * time.Second) // past the watch's delay after the take (agrees)
	leases := c.CoordinationV1().Leases("ns")
	if err := leases.Delete(ctx, SlotLeaseName(0), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the deleted slot was not made again for its holder", func() bool {
		l, err := leases.Get(ctx, SlotLeaseName(0), metav1.GetOptions{})
		return err == nil && holder(l) == "a"
	})
	if err := slot.Check(ctx); err != nil {
		t.Fatalf("Check after the slot was made again: %v", err)
	}
	// Another writer takes it: the next Check says so, however recent the
	// last renewal.
	l, err := leases.Get(ctx, SlotLeaseName(0), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Spec.HolderIdentity = ptr.To("z")
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "Check vouched for a slot another holds", func() bool { return slot.Check(ctx) != nil })
}

func TestFreedSlotWaitsForItsLastHolder(t *testing.T) {
	for _, how := range []string{"deleted", "cleared"} {
		t.Run(how, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			x := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{record.LabelState: record.StatePending}},
				Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: record.TaintReconfiguring, Effect: corev1.TaintEffectNoSchedule}}}}
			c, clk := versionedFake(x)
			queuedSlot(t, c, SlotLeaseName(0), "x") // x's agent mid-change, its process not in this test
			b := newSlots(c, clk, "b")
			got := make(chan error, 1)
			go func() {
				s, err := b.Acquire(ctx)
				if s != nil {
					defer s.Release(false)
				}
				got <- err
				<-ctx.Done()
			}()
			waitUntil(t, "b never joined x's queue", func() bool {
				clk.Step(50 * time.Millisecond)
				return len(queueOf(getSlot(t, c, SlotLeaseName(0)))) == 1
			})
			leases := c.CoordinationV1().Leases("ns")
			if how == "deleted" {
				if err := leases.Delete(ctx, SlotLeaseName(0), metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			} else {
				l := getSlot(t, c, SlotLeaseName(0))
				l.Spec.HolderIdentity = ptr.To("")
				if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			for range 40 { // 4 s of the fake clock, in real time too
				time.Sleep(10 * time.Millisecond)
				clk.Step(100 * time.Millisecond)
				select {
				case <-got:
					t.Fatalf("b took the slot %s while x, its last holder, is mid-change", how)
				default:
				}
			}
			// x's change ends: its Node is whole, and b takes the slot.
			x.Labels[record.LabelState], x.Spec.Taints = record.StateSuccess, nil
			if _, err := c.CoreV1().Nodes().Update(ctx, x, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(5 * time.Second); ; {
				select {
				case err := <-got:
					if err != nil {
						t.Fatal(err)
					}
					return
				case <-time.After(10 * time.Millisecond):
					clk.Step(100 * time.Millisecond)
				}
				if time.Now().After(deadline) {
					t.Fatal("b never took the slot once x was whole")
				}
			}
		})
	}
}

// A queue entry for a node that does not exist (written by any token that
// may patch the slot Leases) is not handed the slot: the hand-off passes it
// over to the next that exists and removes its entry; with nobody else
// queued, the slot is released.
func TestQueueEntryWithoutNodePassedOver(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		queue []string
		want  string
	}{{"then a node", []string{"ghost-1", "y"}, "y"}, {"alone", []string{"ghost-1"}, ""}} {
		t.Run(tc.name, func(t *testing.T) {
			c, clk := versionedFake()
			queuedSlot(t, c, SlotLeaseName(0), "x", tc.queue...)
			x := newSlots(c, clk, "x")
			to, err := x.handOver(ctx, getSlot(t, c, SlotLeaseName(0)), storeOf(c))
			if err != nil || to != tc.want {
				t.Fatalf("hand-off to %q (%v), want %q", to, err, tc.want)
			}
			l := getSlot(t, c, SlotLeaseName(0))
			if holder(l) != tc.want || l.Annotations[queueKey("ghost-1")] != "" {
				t.Fatalf("slot after the hand-off: holder %q, annotations %v", holder(l), l.Annotations)
			}
		})
	}
}
