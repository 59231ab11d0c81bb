package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/internal/backoff"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/record"
)

// Slots is a cluster-wide semaphore of N Leases (coordination.k8s.io) in
// the agent's namespace: a node takes one before it evicts or reboots, so
// at most N nodes are disrupted at once. A holder renews its Lease while it
// works; a crashed holder's slot expires after the lease duration.
//
// A node waiting for a slot costs the API server nothing while nothing
// changes: it watches the slot Leases (an informer on the agent's namespace,
// filtered by LabelRolloutSlot) and tries to take one only when its cache
// shows one free, after a Lease changed or when the earliest held one
// expires (expiry makes no watch event: a timer stands for it). The
// optimistic concurrency of the API server (resourceVersion on update, a name
// taken once on create) keeps two nodes from taking the same slot.
type Slots struct {
	Client    kclient.Interface
	Namespace string
	Holder    string // the node name
	N         int
	// Percent, when above 0, sets N at each Acquire to that share of the
	// pool, rounded down and at least 1 (PoolShare).
	Percent  int
	Duration time.Duration
	Clock    clock.Clock
	Log      *slog.Logger
	// Spread bounds the random wait between seeing a slot freed and trying
	// it (default DefaultSlotSpread): of many queued nodes the first to try
	// takes it, and the others see it taken in their caches before their
	// turn, instead of all asking at once and all but one losing a conflict.
	Spread time.Duration

	mu   sync.Mutex
	held string // the slot Lease taken by Acquire, until released
	keep bool   // ExtendForReboot ran: release keeps the Lease
}

// LabelRolloutSlot marks the slot Leases (value "true"); the queued nodes'
// watch selects on it.
const LabelRolloutSlot = "migagent.io/rollout-slot"

// DefaultSlotSpread is Slots.Spread unless set.
const DefaultSlotSpread = 500 * time.Millisecond

// RebootHold is how long a slot stays taken, unrenewed, while its node
// reboots for a change (ExtendForReboot): the node is disrupted until it is
// back and resumes, which takes its Lease again at once. A node that never
// comes back frees the slot after this long.
const RebootHold = 30 * time.Minute

// PoolShare is Percent of the pool, rounded down and at least 1: the pool is
// the agents of the namespace, counted by their unexpired node Leases
// (LabelLease; one per node running the agent), so a node that left the
// pool stops counting once its Lease expires.
func (s *Slots) PoolShare(ctx context.Context) (n, pool int, err error) {
	l, err := s.Client.CoordinationV1().Leases(s.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelLease + "=node"})
	if err != nil {
		return 0, 0, err
	}
	for i := range l.Items {
		if !leaseExpiry(&l.Items[i]).Before(s.Clock.Now()) {
			pool++
		}
	}
	return max(1, pool*s.Percent/100), pool, nil
}

// SlotLeaseName is the name of slot i.
func SlotLeaseName(i int) string { return fmt.Sprintf("mig-agent-slot-%d", i) }

// Acquire blocks until a slot is taken (or ctx ends) and returns its release.
// While it waits it holds one watch on the slot Leases and sends nothing
// else: a try follows a Lease change or an expiry, and only when the cache
// shows a slot free (released, expired, absent, or this holder's own).
func (s *Slots) Acquire(ctx context.Context) (func(), error) {
	if s.Percent > 0 {
		n, pool, err := s.PoolShare(ctx)
		if err != nil {
			return nil, fmt.Errorf("counting the agents for --max-concurrent %d%%: %w", s.Percent, err)
		}
		s.Log.Debug("rollout slots from the pool", "percent", s.Percent, "agents", pool, "slots", n)
		s.N = n
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	changed := make(chan struct{}, 1)
	store, err := s.watch(wctx, changed)
	if err != nil {
		return nil, err
	}
	spread := s.Spread
	if spread <= 0 {
		spread = DefaultSlotSpread
	}
	retries := backoff.API()
	logged := false
	// A pool-wide change starts every queued node at once: the first try
	// is spread too.
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.Clock.After(rand.N(spread)):
	}
	exists := map[string]bool{} // created by another while absent from the cache
	for {
		free, next := s.scan(store)
		trouble := false // an error or a lost race: look again after a jittered wait
		// One try a round: a node that lost a race waits for the winner's
		// write to reach its cache instead of trying every other slot.
		if len(free) > 0 {
			c := free[0]
			ok, err := s.take(ctx, c.name, c.lease, exists[c.name])
			switch {
			case ok:
				s.Log.Info("took rollout slot", "lease", c.name)
				s.mu.Lock()
				s.held, s.keep = c.name, false
				s.mu.Unlock()
				return s.hold(ctx, c.name), nil
			case errors.Is(err, errSlotExists):
				exists[c.name] = true
				trouble = true
			case err != nil:
				s.Log.Debug("rollout slot", "lease", c.name, "err", err)
				trouble = true
			default:
				trouble = true // another node won it; its write reaches the cache
			}
		}
		if !logged {
			s.Log.Info("all rollout slots taken; waiting", "slots", s.N)
			logged = true
		}
		var retry, expiry <-chan time.Time
		if trouble {
			retry = s.Clock.After(retries.Step())
		} else {
			retries = backoff.API()
		}
		if !next.IsZero() {
			expiry = s.Clock.After(max(next.Sub(s.Clock.Now()), 0) + time.Millisecond)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
			// Every queued node saw the same change: each waits its own
			// random part of spread, then looks at its cache again.
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-s.Clock.After(rand.N(spread)):
			}
		case <-expiry:
		case <-retry:
		}
	}
}

// watch starts an informer on the slot Leases of the namespace; changed
// receives a token after every add, update or delete. The store is synced
// when watch returns; the informer stops with ctx.
func (s *Slots) watch(ctx context.Context, changed chan<- struct{}) (cache.Store, error) {
	sel := labels.SelectorFromSet(labels.Set{LabelRolloutSlot: "true"}).String()
	leases := s.Client.CoordinationV1().Leases(s.Namespace)
	inf := kclient.NewInformer(s.Client, &coordinationv1.Lease{},
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sel
			return leases.List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel
			return leases.Watch(ctx, o)
		})
	poke := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, DeleteFunc: poke, UpdateFunc: func(_, n any) { poke(n) },
	}); err != nil {
		return nil, fmt.Errorf("watching the rollout slots: %w", err)
	}
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, fmt.Errorf("watching the rollout slots: %w", context.Cause(ctx))
	}
	return inf.GetStore(), nil
}

// candidate is a slot the cache shows free; lease is nil when it does not
// exist yet.
type candidate struct {
	name  string
	lease *coordinationv1.Lease
}

// scan reads the cache: the slots free for this holder, in random order (two
// queued nodes rarely pick the same one), and the earliest moment a slot held
// by another expires (zero when none is).
func (s *Slots) scan(store cache.Store) ([]candidate, time.Time) {
	var free []candidate
	var next time.Time
	for _, i := range rand.Perm(s.N) {
		name := SlotLeaseName(i)
		obj, ok, _ := store.GetByKey(s.Namespace + "/" + name)
		if !ok {
			free = append(free, candidate{name: name})
			continue
		}
		l := obj.(*coordinationv1.Lease)
		holder := ptr.Deref(l.Spec.HolderIdentity, "")
		if holder == "" || holder == s.Holder || s.expired(l) {
			free = append(free, candidate{name: name, lease: l})
			continue
		}
		if end := leaseExpiry(l); next.IsZero() || end.Before(next) {
			next = end
		}
	}
	return free, next
}

// errSlotExists: the slot Lease the cache does not show exists.
var errSlotExists = errors.New("rollout slot exists")

// take tries slot name as the cache shows it (nil: absent): an update on
// its resourceVersion or a create. (false, nil) when another node was first.
// A create that finds the Lease there returns errSlotExists: taken a moment
// ago (its write is on its way to the cache), or, when it happens again
// (read), a slot Lease from before LabelRolloutSlot that the watch does not
// see: then it is read, and taken if free (which labels it).
func (s *Slots) take(ctx context.Context, name string, cached *coordinationv1.Lease, read bool) (bool, error) {
	leases := s.Client.CoordinationV1().Leases(s.Namespace)
	if cached == nil {
		if read {
			return s.try(ctx, name)
		}
		_, err := leases.Create(ctx, s.claim(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.Namespace}}), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return false, errSlotExists
		}
		return err == nil, ignoreConflict(err)
	}
	_, err := leases.Update(ctx, s.claim(cached.DeepCopy()), metav1.UpdateOptions{})
	return err == nil, ignoreConflict(err)
}

// claim makes l this holder's, from now, for the lease duration, labelled
// as a slot.
func (s *Slots) claim(l *coordinationv1.Lease) *coordinationv1.Lease {
	now := metav1.NewMicroTime(s.Clock.Now())
	secs := int32(s.Duration / time.Second)
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[record.LabelManagedBy], l.Labels[LabelRolloutSlot] = "mig-agent", "true"
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = ptr.To(s.Holder), &secs
	l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
	return l
}

// try reads slot name and takes it when it is free for this holder (also
// renewing it, when this holder has it): a Get and an update or a create.
func (s *Slots) try(ctx context.Context, name string) (bool, error) {
	leases := s.Client.CoordinationV1().Leases(s.Namespace)
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, s.claim(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.Namespace}}), metav1.CreateOptions{})
		return err == nil, ignoreConflict(err)
	}
	if err != nil {
		return false, err
	}
	holder := ptr.Deref(l.Spec.HolderIdentity, "")
	if holder != "" && holder != s.Holder && !s.expired(l) {
		return false, nil
	}
	_, err = leases.Update(ctx, s.claim(l), metav1.UpdateOptions{})
	return err == nil, ignoreConflict(err)
}

// ExtendForReboot keeps the slot this holder took through a reboot: the
// Lease is renewed now for RebootHold (or the lease duration, if longer),
// and the release that follows stops renewing it without freeing it. After
// the reboot, Acquire takes it again (a holder always may take its own).
func (s *Slots) ExtendForReboot(ctx context.Context) error {
	s.mu.Lock()
	name := s.held
	s.mu.Unlock()
	if name == "" {
		return fmt.Errorf("no rollout slot held")
	}
	leases := s.Client.CoordinationV1().Leases(s.Namespace)
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("rollout slot %s: %w", name, err)
	}
	if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != s.Holder {
		return fmt.Errorf("rollout slot %s is held by %q", name, h)
	}
	secs := int32(max(RebootHold, s.Duration) / time.Second)
	now := metav1.NewMicroTime(s.Clock.Now())
	l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &secs, &now
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("rollout slot %s: %w", name, err)
	}
	s.mu.Lock()
	s.keep = true
	s.mu.Unlock()
	return nil
}

func ignoreConflict(err error) error {
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

func (s *Slots) expired(l *coordinationv1.Lease) bool {
	return s.Clock.Now().After(leaseExpiry(l))
}

// leaseExpiry is when l ends unless renewed (the zero time when it has no
// renew time or duration: long expired).
func leaseExpiry(l *coordinationv1.Lease) time.Time {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return time.Time{}
	}
	return l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
}

// hold renews the lease until released, then frees it.
func (s *Slots) hold(ctx context.Context, name string) func() {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		every := max(s.Duration/3, time.Second)
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-s.Clock.After(every):
				s.mu.Lock()
				keep := s.keep
				s.mu.Unlock()
				if keep {
					continue // stretched for the reboot; renewing would shorten it
				}
				if ok, err := s.try(context.WithoutCancel(ctx), name); !ok || err != nil {
					s.Log.Warn("renewing the rollout slot failed", "lease", name, "err", err)
				}
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
		s.mu.Lock()
		keep := s.keep
		s.held, s.keep = "", false
		s.mu.Unlock()
		if keep {
			s.Log.Info("keeping the rollout slot through the reboot", "lease", name, "for", RebootHold)
			return
		}
		leases := s.Client.CoordinationV1().Leases(s.Namespace)
		bg := context.WithoutCancel(ctx)
		if l, err := leases.Get(bg, name, metav1.GetOptions{}); err == nil && ptr.Deref(l.Spec.HolderIdentity, "") == s.Holder {
			l.Spec.HolderIdentity = ptr.To("")
			if _, err := leases.Update(bg, l, metav1.UpdateOptions{}); err != nil {
				s.Log.Warn("releasing the rollout slot failed; it expires by itself", "lease", name, "err", err)
			}
		}
		s.Log.Info("released rollout slot", "lease", name)
	}
}
