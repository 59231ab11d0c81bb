package lease

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/migagent/mig-agent/reconcile"
	"github.com/migagent/mig-agent/testkit/clientset"
	"github.com/migagent/mig-agent/testkit/testsupport"
)

func TestSlotExpires(t *testing.T) {
	ctx := context.Background()
	c := newFake()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	crashed := &Slots{Client: clientset.Wrap(c), Namespace: "ns", Holder: "dead", N: 1, Duration: 30 * time.Second, Clock: clk, Log: testsupport.Discard()}
	if ok, err := crashed.try(ctx, SlotLeaseName(0)); ok == nil || err != nil {
		t.Fatal(ok, err)
	}
	other := &Slots{Client: clientset.Wrap(c), Namespace: "ns", Holder: "alive", N: 1, Duration: 30 * time.Second, Clock: clk, Log: testsupport.Discard()}
	if ok, _ := other.try(ctx, SlotLeaseName(0)); ok != nil {
		t.Fatal("took a live slot")
	}
	clk.Step(31 * time.Second)
	if ok, err := other.try(ctx, SlotLeaseName(0)); ok == nil || err != nil {
		t.Fatalf("expired slot not taken: %v %v", ok, err)
	}
}

// A queued holder takes a slot whose holder crashed when its Lease expires,
// though nothing changes on the API server: a timer stands for the expiry.
func TestSlotExpiresWhileQueued(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := newFake()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	crashed := &Slots{Client: clientset.Wrap(c), Namespace: "ns", Holder: "dead", N: 1, Duration: 30 * time.Second, Clock: clk, Log: testsupport.Discard()}
	if ok, err := crashed.try(ctx, SlotLeaseName(0)); ok == nil || err != nil {
		t.Fatal(ok, err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := (&Slots{Client: clientset.Wrap(c), Namespace: "ns", Holder: "alive", N: 1, Duration: 30 * time.Second, Clock: clk, Log: testsupport.Discard()}).Acquire(ctx)
		got <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); !clk.HasWaiters(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the queued holder never waited")
		}
	}
	clk.Step(29 * time.Second) // past the first try's spread; the Lease lives on
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
			if !clk.Now().After(time.Unix(1030, 0)) {
				t.Fatalf("took a live slot at %v; it expires at %v", clk.Now(), time.Unix(1030, 0))
			}
			return
		case <-time.After(20 * time.Millisecond):
			clk.Step(100 * time.Millisecond)
		}
	}
	t.Fatal("expired slot not taken by the queued holder")
}

// Two slots, three holders: the third waits, sends no request while the
// slots stay held (clock moving, Leases renewed), and takes the slot the
// first releases.
func TestSlots(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := newFake()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	slot := func(holder string) *Slots {
		return &Slots{Client: clientset.Wrap(c), Namespace: "ns", Holder: holder, N: 2, Duration: 30 * time.Second, Clock: clk, Log: testsupport.Discard(), Spread: 200 * time.Millisecond}
	}
	relA, err := acquireStepping(t, clk, slot("a"))
	if err != nil {
		t.Fatal(err)
	}
	b := slot("b")
	if _, err := acquireStepping(t, clk, b); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { _, err := slot("c").Acquire(ctx); got <- err }()
	waitLog := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("timed out: " + what)
			}
		}
	}
	// c is queued once it has listed and watched the Leases.
	watching := func() bool {
		for _, a := range c.Actions() {
			if a.GetVerb() == "watch" && a.GetResource().Resource == "leases" {
				return true
			}
		}
		return false
	}
	joined := func() bool { // c's own join (b may have joined and left a queue)
		for _, a := range c.Actions() {
			if p, ok := a.(k8stesting.PatchAction); ok && strings.Contains(string(p.GetPatch()), queueKey("c")+`":"`) {
				return true
			}
		}
		return false
	}
	// It finds every slot taken and joins a queue: one request.
	waitLog("the third holder's watch and join", func() bool {
		if !joined() && clk.HasWaiters() {
			clk.Step(20 * time.Millisecond) // its turn to join
		}
		return watching() && joined() && clk.HasWaiters()
	})
	time.Sleep(20 * time.Millisecond)
	clk.Step(200 * time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	before := len(c.Actions())
	// A renewal by b is a Lease change that frees nothing: c looks at its
	// cache, not at the API server.
	if ok, err := b.try(ctx, SlotLeaseName(1)); ok == nil || err != nil {
		if ok, err = b.try(ctx, SlotLeaseName(0)); ok == nil || err != nil {
			t.Fatalf("renewing b: %v %v", ok, err)
		}
	}
	renewal := len(c.Actions()) - before
	for range 6 { // short of the holders' renewals (every 10 s)
		clk.Step(time.Second) // spreads and retries due, slots still held
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-got:
		t.Fatalf("third holder got a slot while two are held (err %v)", err)
	default:
	}
	// c's first look came after a's and b's takes, so its turn to join,
	// stepped above, may bring the holders' own renewals (every 10 s)
	// into these steps: those are theirs.
	extra := slices.DeleteFunc(slices.Clone(c.Actions()[before+renewal:]), func(a k8stesting.Action) bool {
		u, ok := a.(k8stesting.UpdateAction)
		if !ok {
			return false
		}
		l, ok := u.GetObject().(*coordinationv1.Lease)
		return ok && (holder(l) == "a" || holder(l) == "b")
	})
	if len(extra) != 0 {
		t.Fatalf("a queued holder sent %d requests while the slots stayed held: %v", len(extra), extra)
	}
	relA.Release(false)
	for range 50 {
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
			return
		case <-time.After(20 * time.Millisecond):
			clk.Step(50 * time.Millisecond) // the spread after the release
		}
	}
	t.Fatal("third holder did not get the released slot")
}

// acquireStepping takes a slot, moving the fake clock past the spread of
// the first try.
func acquireStepping(t *testing.T, clk *clocktesting.FakeClock, s *Slots) (reconcile.Slot, error) {
	t.Helper()
	type res struct {
		release reconcile.Slot
		err     error
	}
	got := make(chan res, 1)
	go func() { r, err := s.Acquire(context.Background()); got <- res{r, err} }()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		select {
		case r := <-got:
			return r.release, r.err
		case <-time.After(10 * time.Millisecond):
			clk.Step(50 * time.Millisecond)
		}
	}
	t.Fatal("no slot taken")
	return nil, nil
}
