package lease

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/lease/leaseobs"
	"github.com/migagent/mig-agent/lease/nodelease"
	"github.com/migagent/mig-agent/reconcile"
	"github.com/migagent/mig-agent/record"
)

// Slots is a cluster-wide semaphore of N Leases (coordination.k8s.io) in
// the agent's namespace: a node takes one before it evicts or reboots, so
// at most N nodes are disrupted at once. A holder renews its Lease while it
// works (Slot.Check before each disruptive step confirms it still does).
//
// A slot passes to another node only when it is free: released, absent,
// or expired as this reader judges it (leaseobs.Observer: unchanged since this
// reader saw it for its duration, whatever the holder's clock says) AND the
// holder's Node is whole again. A holder that died mid-change leaves its
// Node tainted or in state pending/rebooting: that node is still disrupted
// and keeps counting against the bound until its agent, back, finishes the
// change (it takes its own slot again at once), or the Node is gone, or
// the slot was unchanged for RebootHold (a node that never comes back).
//
// A node waiting for a slot watches the slot Leases (an informer on the
// agent's namespace, filtered by LabelRolloutSlot). When every slot is held
// it joins one slot's queue (queue.go: one merge patch) and is handed the
// slot by its holder, in the write that ends the holder's hold; it sends
// nothing else while it waits. It tries to take a slot only when its cache
// shows one free (released with nobody queued, expired, or never made),
// after a Lease changed or when the earliest held one expires (expiry makes
// no watch event: a timer stands for it). The optimistic concurrency of the
// API server (resourceVersion on update, a name taken once on create, a
// hand-off that tests its writer holds the slot) keeps two nodes from
// holding the same slot.
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
	// Spread is the first window over which queued nodes spread their
	// turns for a freed slot (default DefaultSlotSpread); the hand-offs an
	// Acquire sees move it (handOffs): of many queued nodes the first in
	// turn takes a slot, and the others see it taken in their caches before
	// their turn, instead of all asking at once and all but one losing a
	// conflict.
	Spread time.Duration

	obs leaseobs.Observer
	// ticket is this node's place in line while it waits and holds: when
	// it first saw the slots, in Unix milliseconds (Acquire).
	ticket atomic.Int64
	// window is what this holder's take wrote as the slot's next turn
	// window (AnnotationTurnWindow); its renewals keep it.
	window time.Duration
	mu     sync.Mutex
	cur    *slotHold // the slot taken by Acquire, until released
	// nodes caches, per slot, whether its expired holder's Node is still
	// disrupted, for the record it was judged on.
	nodes map[string]nodeVerdict
	// handedOn: per slot, the record this node handed on (handOn), which
	// a cache behind still shows handed to it.
	handedOn map[string]string
	// lastHeld: per slot, its last holder record the watch showed (kept
	// when the slot is released or deleted: freed).
	lastHeld map[string]*coordinationv1.Lease
	// noNode: the queued names a hand-off found no Node for, and when
	// (liveSuccessor).
	noNode map[string]time.Time
}

// nodeVerdict: whether the holder's Node was disrupted when the slot's
// record was as it is (at: when it was read).
type nodeVerdict struct {
	record    string
	disrupted bool
	at        time.Time
}

// LabelRolloutSlot marks the slot Leases (value "true"); the queued nodes'
// watch selects on it.
const LabelRolloutSlot = "migagent.io/rollout-slot"

// DefaultSlotSpread is Slots.Spread unless set.
const DefaultSlotSpread = 2 * time.Second

// RebootHold is how long a slot stays taken, unrenewed, while its node
// reboots for a change (ExtendForReboot): the node is disrupted until it is
// back and resumes, which takes its Lease again at once. A node that never
// comes back frees the slot after this long.
const RebootHold = 30 * time.Minute

// PoolShare is Percent of the pool, rounded down and at least 1: the pool is
// the agents of the namespace, counted by their unexpired node Leases
// (nodelease.LabelLease; one per node running the agent), so a node that
// left the pool stops counting once its Lease expires, and only Leases of
// Nodes that exist count: anyone who may write Leases in the namespace can
// make node Leases, not Nodes. The Nodes are listed from the API server's
// cache (resourceVersion 0).
func (s *Slots) PoolShare(ctx context.Context) (n, pool int, err error) {
	l, err := s.Client.CoordinationV1().Leases(s.Namespace).List(ctx, metav1.ListOptions{LabelSelector: nodelease.LabelLease + "=node"})
	if err != nil {
		return 0, 0, err
	}
	live := map[string]bool{}
	for i := range l.Items {
		if !renewedUntil(&l.Items[i]).Before(s.Clock.Now()) {
			live[l.Items[i].Name] = true
		}
	}
	nodes, err := s.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return 0, 0, err
	}
	for i := range nodes.Items {
		if live[nodelease.NodeLeaseName(nodes.Items[i].Name)] {
			pool++
		}
	}
	return max(1, pool*s.Percent/100), pool, nil
}

// renewedUntil is when l ends by its holder's own clock (renewTime plus
// duration; the zero time without them). Only the pool count reads it: a
// skewed clock there moves a node in or out of the count by a little,
// while slot expiry never compares another machine's clock (package leaseobs).
func renewedUntil(l *coordinationv1.Lease) time.Time {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return time.Time{}
	}
	return l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
}

// SlotLeaseName is the name of slot i.
func SlotLeaseName(i int) string { return fmt.Sprintf("mig-agent-slot-%d", i) }

// nextInQueue: this node is in slot name's queue, as the cache shows it,
// with nobody still waiting ahead of it.
func (s *Slots) nextInQueue(store cache.Store, name string) bool {
	q := queueOf(s.cached(store, name))
	pos := s.queuePos(q)
	return pos >= 0 && len(s.waiting(q[:pos], s.holding(store))) == 0
}

// spread is the first turn window: Spread, or DefaultSlotSpread.
func (s *Slots) spread() time.Duration {
	if s.Spread > 0 {
		return s.Spread
	}
	return DefaultSlotSpread
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// slotVersion is the resourceVersion of a free slot as the cache shows it,
// "absent" for one not created yet.
func slotVersion(c *candidate) string {
	if c.lease == nil {
		return "absent"
	}
	return c.lease.ResourceVersion
}

// lostRace: a take of a slot's version rv lost to another node's write;
// that version is not tried again until until (the winner's write reaches
// the cache first, unless the watch is broken).
type lostRace struct {
	rv    string
	until time.Time
}

// lateTurn is how late after its turn a node still tries a slot at once.
const lateTurn = HandOffGap

// lostRaceHold bounds how long a version a race was lost on is skipped.
const lostRaceHold = 5 * time.Second

// turn is how long this node waits before trying slot c, which the cache
// shows freed. Every queued node computes the same order from the Lease
// data: a hash of the slot's name and resourceVersion (a new order for each
// release: no node is always last) and the node's own name, scaled over the
// window. The first in that order tries at once, the next a fraction of the
// window later, by when the first one's write is in its cache: so a bounded
// number try each freed slot, however long the queue, and the slot goes to
// the node whose turn it is. Every queued node uses the same window
// (handOffs), so no node's turn is pushed back by its own bad luck.
func (s *Slots) turn(c candidate, window time.Duration) time.Duration {
	return time.Duration(s.order(c) * float64(window))
}

// home is this node's home slot: the first tried when many are free.
func (s *Slots) home() string {
	return SlotLeaseName(int(unitHash(s.Holder) * float64(max(s.N, 1))))
}

// order is this node's place in [0, 1) in the order of slot c's version.
func (s *Slots) order(c candidate) float64 { return unitHash(c.name, slotVersion(&c), s.Holder) }

// unitHash maps parts to [0, 1), alike on every node: the first 53 bits of
// the SHA-256 of the parts joined by NUL.
func unitHash(parts ...string) float64 {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return float64(binary.BigEndian.Uint64(sum[:8])>>11) / (1 << 53)
}

// The window over which queued nodes spread their turns follows the
// hand-offs every queued node sees alike: from the moment a slot is seen
// freed to the moment it is seen taken (the gap). The gap is the first
// turn (about window/(Q+1) for Q queued nodes, and the next turn as much
// later) plus the time a write takes to reach the caches (the delay; the
// shortest recent gap stands for it). Turns closer than the delay race; the
// window aims for a gap of three delays (at least HandOffGap), so that the
// turns are about twice the delay apart: a shorter gap widens the window (a
// long queue), a longer one narrows it (the queue has drained). Every
// queued node sees the same releases and takes, so all of them keep about
// the same window, without a request.
const (
	// HandOffGap is the shortest gap between a release and the next take
	// that the window aims for.
	HandOffGap = 60 * time.Millisecond
	minWindow  = 2 * HandOffGap
	maxWindow  = time.Minute
	// delaySamples is how many recent gaps the delay is the least of.
	delaySamples = 8
)

// handOffs tracks, per slot, when it was seen freed, the recent gaps and
// the window; and when a slot was last seen made (lastMade: the making of
// slots at the start of a pool-wide change is still going on).
type handOffs struct {
	window   time.Duration
	freed    map[string]time.Time
	gaps     []time.Duration // the last delaySamples gaps, oldest first
	made     int             // the slots the cache showed made
	lastMade time.Time       // when that count last grew
}

// observe notes what the cache shows now: a slot released starts a
// hand-off; a freed slot taken by another ends it, and its gap moves the
// window (nextWindow). More slots made than last time moves lastMade.
func (h *handOffs) observe(store cache.Store, ns string, n int, self string, now time.Time) {
	made := 0
	for i := range n {
		name := SlotLeaseName(i)
		obj, ok, _ := store.GetByKey(ns + "/" + name)
		if !ok {
			// Never made (or deleted): its first take is no hand-off.
			// At the start of a pool-wide change every slot is absent
			// and seen taken one after another, seconds apart as the
			// agents get to them: counted as gaps, they would move the
			// window far from what the hand-offs that follow need.
			delete(h.freed, name)
			continue
		}
		made++
		holder := ptr.Deref(obj.(*coordinationv1.Lease).Spec.HolderIdentity, "")
		at, freed := h.freed[name]
		switch {
		case holder == "" && !freed:
			h.freed[name] = now
		case holder != "" && freed:
			delete(h.freed, name)
			if holder != self {
				gap := now.Sub(at)
				if h.gaps = append(h.gaps, gap); len(h.gaps) > delaySamples {
					h.gaps = h.gaps[1:]
				}
				h.window = nextWindow(h.window, gap, slices.Min(h.gaps))
			}
		}
	}
	if made > h.made {
		h.lastMade = now
	}
	h.made = made
}

// AnnotationTurnWindow on a slot Lease is the window, in milliseconds, over
// which the queued nodes spread their turns when it is next freed: the
// taker writes it with its take (no request of its own), so that every
// queued node, one that joined the queue a moment ago included, spreads
// over the same window.
const AnnotationTurnWindow = "migagent.io/turn-window"

// windowFor is the window for slot l's next hand-off: as its last taker
// wrote it, within [minWindow, maxWindow]; this node's own (h.window) for a
// slot without one (absent, or written by an older agent).
func (h *handOffs) windowFor(l *coordinationv1.Lease) time.Duration {
	if l == nil {
		return h.window
	}
	ms, err := strconv.ParseInt(l.Annotations[AnnotationTurnWindow], 10, 64)
	if err != nil || ms <= 0 {
		return h.window
	}
	return min(max(time.Duration(ms)*time.Millisecond, minWindow), maxWindow)
}

// shared is the window every queued node uses: the one written with the
// latest take of any slot (by acquireTime; the same for every reader of the
// same Leases), so that with many slots it follows every hand-off, not only
// one slot's few; this node's own (h.window) while no slot carries one.
func (h *handOffs) shared(store cache.Store, ns string, n int) time.Duration {
	var latest *coordinationv1.Lease
	for i := range n {
		obj, ok, _ := store.GetByKey(ns + "/" + SlotLeaseName(i))
		if !ok {
			continue
		}
		l := obj.(*coordinationv1.Lease)
		if _, has := l.Annotations[AnnotationTurnWindow]; !has || l.Spec.AcquireTime == nil {
			continue
		}
		if latest == nil || l.Spec.AcquireTime.After(latest.Spec.AcquireTime.Time) {
			latest = l
		}
	}
	return h.windowFor(latest)
}

// next is the window a taker writes for the next hand-off. The
// taker was first in c's order at place u (in [0, 1)): of Q queued nodes the
// first falls near 1/(Q+1), so the window that puts turns a spacing apart is
// about spacing/u; the spacing is two cache delays (the shortest recent gap
// this node saw), at least HandOffGap. The window moves halfway there (in
// ratio), by at most a factor of two.
func (h *handOffs) next(cur time.Duration, u float64) time.Duration {
	spacing := HandOffGap
	if len(h.gaps) > 0 {
		spacing = max(HandOffGap, 2*slices.Min(h.gaps))
	}
	ideal := float64(spacing) / max(u, 1e-6)
	f := math.Sqrt(ideal / float64(cur))
	f = min(max(f, 0.5), 2)
	return min(max(time.Duration(f*float64(cur)), minWindow), maxWindow)
}

// nextWindow is the window after a hand-off that took gap, when writes take
// about delay to reach the caches: scaled by target/gap, target being three
// delays and at least HandOffGap, the factor bounded to [1/2, 2] and the
// window to [minWindow, maxWindow].
func nextWindow(window, gap, delay time.Duration) time.Duration {
	target := max(HandOffGap, 3*delay)
	f := float64(target) / float64(max(gap, time.Millisecond))
	f = min(max(f, 0.5), 2)
	return min(max(time.Duration(f*float64(window)), minWindow), maxWindow)
}

// watch starts an informer on the slot Leases of the namespace; changed
// receives a token after every add, update or delete. The store is synced
// when watch returns; the informer stops with ctx.
func (s *Slots) watch(ctx context.Context, changed chan<- struct{}) (cache.Store, error) {
	sel := labels.SelectorFromSet(labels.Set{LabelRolloutSlot: "true"}).String()
	inf := kclient.Watch(s.Client, &coordinationv1.Lease{}, s.Client.CoordinationV1().Leases(s.Namespace),
		kclient.Selector{Label: sel})
	poke := func(obj any) {
		// Seen now: expiry counts from here (leaseobs.Observer).
		if l, ok := obj.(*coordinationv1.Lease); ok {
			s.obs.Observe(l, s.Clock.Now())
			s.noteHeld(l)
		}
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
	kclient.Start(ctx, inf)
	if !kclient.Synced(ctx, inf) {
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
// by another may be free (zero when none is).
func (s *Slots) scan(ctx context.Context, store cache.Store) ([]candidate, time.Time) {
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
		isFree, at := s.free(ctx, l)
		if isFree {
			free = append(free, candidate{name: name, lease: l})
			continue
		}
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return free, next
}

// free says whether slot l may be taken by this holder: released, its own,
// or expired with its holder's Node whole again. When not, at is when to
// look again.
func (s *Slots) free(ctx context.Context, l *coordinationv1.Lease) (bool, time.Time) {
	holder := ptr.Deref(l.Spec.HolderIdentity, "")
	if holder == "" || holder == s.Holder {
		return true, time.Time{}
	}
	now := s.Clock.Now()
	end := s.obs.Expiry(l, now, s.longest())
	if now.Before(end) {
		return false, end
	}
	// Expired: its holder stopped renewing. A node left mid-change is
	// still disrupted and keeps the slot, up to RebootHold unchanged.
	if seen := s.obs.Observe(l, now); !now.Before(seen.Add(RebootHold)) {
		s.Log.Warn("taking a rollout slot whose holder has not renewed it for a long time", "lease", l.Name, "holder", holder, "for", RebootHold)
		return true, time.Time{}
	}
	if s.holderDisrupted(ctx, l, holder, now, max(s.Duration, time.Second)) {
		return false, now.Add(max(s.Duration, time.Second))
	}
	return true, time.Time{}
}

// noteHeld remembers slot l's holder record while it is held (freed).
func (s *Slots) noteHeld(l *coordinationv1.Lease) {
	if holder(l) == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastHeld == nil {
		s.lastHeld = map[string]*coordinationv1.Lease{}
	}
	s.lastHeld[l.Name] = l
}

// freedRecheck is how soon a node looks again at a slot freed while its
// last holder's Node was mid-change.
const freedRecheck = 2 * time.Second

// freed says whether slot name, seen released or absent, may be taken: its
// last holder as this node's watch showed it (if any) is this node or its
// Node is whole. A holder releases its slot only once its change ended;
// a slot released or deleted by another writer (a token clearing the
// holder, an operator's `kubectl delete lease` to unstick a rollout) while
// its holder is mid-change is not taken: that node is still disrupted, and
// its agent makes the slot again for itself (slotHold.mend). When not, at
// is when to look again. Asked only by a node about to take the slot.
func (s *Slots) freed(ctx context.Context, name string) (bool, time.Time) {
	s.mu.Lock()
	last := s.lastHeld[name]
	s.mu.Unlock()
	if last == nil || holder(last) == s.Holder {
		return true, time.Time{}
	}
	now := s.Clock.Now()
	if seen := s.obs.Observe(last, now); !now.Before(seen.Add(RebootHold)) {
		return true, time.Time{}
	}
	if s.holderDisrupted(ctx, last, holder(last), now, freedRecheck) {
		return false, now.Add(freedRecheck)
	}
	return true, time.Time{}
}

// longest is the longest duration a slot Lease honestly carries: the
// reboot hold, or the lease duration if longer.
func (s *Slots) longest() time.Duration { return max(RebootHold, s.Duration) }

// holderDisrupted says whether the Node of a slot's holder is still in the
// middle of a change: tainted by the agent, or in state pending or
// rebooting. A Node that is gone is not; a Node that cannot be read is
// (the safe side). The verdict is read once per Lease record and ttl.
func (s *Slots) holderDisrupted(ctx context.Context, l *coordinationv1.Lease, holder string, now time.Time, ttl time.Duration) bool {
	rec := leaseobs.Record(l)
	s.mu.Lock()
	v, ok := s.nodes[l.Name]
	s.mu.Unlock()
	if ok && v.record == rec && now.Sub(v.at) < ttl {
		return v.disrupted
	}
	disrupted := true
	node, err := s.Client.CoreV1().Nodes().Get(ctx, holder, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		disrupted = false
	case err != nil:
		s.Log.Warn("reading the Node of an expired rollout slot's holder failed; counting it as disrupted", "lease", l.Name, "holder", holder, "err", err)
	default:
		disrupted = nodeMidChange(node)
	}
	if disrupted {
		s.Log.Info("a rollout slot's holder stopped renewing it mid-change; its node still counts", "lease", l.Name, "holder", holder)
	}
	s.mu.Lock()
	if s.nodes == nil {
		s.nodes = map[string]nodeVerdict{}
	}
	s.nodes[l.Name] = nodeVerdict{record: rec, disrupted: disrupted, at: now}
	s.mu.Unlock()
	return disrupted
}

// nodeMidChange: the Node shows a change under way, by any of the marks
// its agent leaves: its taint, its state label (pending: a change going on
// or about to; rebooting: waiting for its reboot), or a GPU Operator operand
// it paused. Each counts alone: with --taint=false there is no taint, and
// a slot handed to a node whose agent died before its first renewal is
// judged by the same marks (a node queued in pending that never saw the
// hand-off keeps it too: the safe side, until its agent is back, its Node
// gone, or RebootHold).
func nodeMidChange(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == record.TaintReconfiguring {
			return true
		}
	}
	for k, v := range n.Labels {
		if v == record.OperandPaused && strings.HasPrefix(k, record.OperandDeployPrefix) {
			return true
		}
	}
	st := n.Labels[record.LabelState]
	return st == record.StatePending || st == record.StateRebooting
}

// errSlotExists: the slot Lease the cache does not show exists.
var errSlotExists = errors.New("rollout slot exists")

// take tries slot name as the cache shows it (nil: absent): an update on
// its resourceVersion or a create. It returns the Lease as written, or nil
// (and no error) when another node was first.
// A create that finds the Lease there returns errSlotExists: taken a moment
// ago (its write is on its way to the cache), or, when it happens again
// (read), a slot Lease from before LabelRolloutSlot that the watch does not
// see: then it is read, and taken if free (which labels it).
func (s *Slots) take(ctx context.Context, name string, cached *coordinationv1.Lease, read bool) (*coordinationv1.Lease, error) {
	leases := s.Client.CoordinationV1().Leases(s.Namespace)
	if cached == nil {
		if read {
			return s.try(ctx, name)
		}
		got, err := leases.Create(ctx, s.claim(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.Namespace}}), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil, errSlotExists
		}
		return written(got, err)
	}
	got, err := leases.Update(ctx, s.claim(cached.DeepCopy()), metav1.UpdateOptions{})
	return written(got, err)
}

// written is a write's result for take and try: the Lease, or nil with no
// error when another node was first (a conflict).
func written(l *coordinationv1.Lease, err error) (*coordinationv1.Lease, error) {
	if err != nil {
		return nil, ignoreConflict(err)
	}
	return l, nil
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
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	if s.window > 0 {
		l.Annotations[AnnotationTurnWindow] = strconv.FormatInt(s.window.Milliseconds(), 10)
	}
	l.Annotations[AnnotationTicket] = strconv.FormatInt(s.ticket.Load(), 10)
	// This node's own write: it is out of any queue of this slot, and
	// the slot is no longer only handed to it.
	delete(l.Annotations, queueKey(s.Holder))
	delete(l.Annotations, AnnotationHandedTo)
	if ptr.Deref(l.Spec.HolderIdentity, "") != s.Holder {
		l.Spec.AcquireTime = &now
	}
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = ptr.To(s.Holder), &secs
	l.Spec.RenewTime = &now
	return l
}

// try reads slot name and takes it when it is free for this holder (also
// renewing it, when this holder has it): a Get and an update or a create.
func (s *Slots) try(ctx context.Context, name string) (*coordinationv1.Lease, error) {
	leases := s.Client.CoordinationV1().Leases(s.Namespace)
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return written(leases.Create(ctx, s.claim(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.Namespace}}), metav1.CreateOptions{}))
	}
	if err != nil {
		return nil, err
	}
	if ok, _ := s.free(ctx, l); !ok {
		return nil, nil
	}
	return written(leases.Update(ctx, s.claim(l), metav1.UpdateOptions{}))
}

// ExtendForReboot keeps the slot this holder took through a reboot: the
// Lease is renewed now for RebootHold (or the lease duration, if longer),
// and the release that follows stops renewing it without freeing it. After
// the reboot, Acquire takes it again (a holder always may take its own).
// It fails when no slot is held or the slot was lost.
func (s *Slots) ExtendForReboot(ctx context.Context) error {
	s.mu.Lock()
	h := s.cur
	s.mu.Unlock()
	if h == nil {
		return fmt.Errorf("no rollout slot held")
	}
	return h.extend(ctx)
}

func ignoreConflict(err error) error {
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// slotHold is a slot taken by Acquire: renewed in the background until
// released; lost when a renewal finds it held by another, or when no
// renewal succeeded for the lease duration (another node may have judged
// it expired).
type slotHold struct {
	s       *Slots
	name    string
	ctx     context.Context
	store   cache.Store     // the slots as the watch shows them (nil: none)
	stop    func()          // stops the watch
	changed <-chan struct{} // the watch saw a change (strays, settle)

	mu      sync.Mutex
	last    *coordinationv1.Lease // as last written
	renewed time.Time             // when the last successful write was sent
	lost    error
	keep    bool // ExtendForReboot ran: release keeps the Lease
	shown   bool // the watch has shown this holder's last write (agrees)
	done    chan struct{}
	stopped chan struct{}
	// gone is closed as the slot is lost (lose): the holder's change
	// stops waiting (on its evictions) at once.
	gone chan struct{}
}

var _ reconcile.Slot = (*slotHold)(nil)

// Lost is closed once the slot is lost.
func (h *slotHold) Lost() <-chan struct{} { return h.gone }

// Guard implements reconcile.Slot: ctx, ended too once the slot is lost.
func (h *slotHold) Guard(ctx context.Context) (context.Context, context.CancelFunc) {
	return guard(ctx, h.gone)
}

// guard is ctx, ended too once gone closes (never when nil).
func guard(ctx context.Context, gone <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-gone:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// lose marks the slot lost, once, with err; it returns the loss. h.mu is
// held.
func (h *slotHold) lose(err error) error {
	if h.lost == nil {
		h.lost = err
		close(h.gone)
	}
	return h.lost
}

// hold starts renewing l, just written by this holder, or handed to it
// (written by its last holder; seen now). The watch of the slots (store;
// stop ends it) lives on until the release.
func (s *Slots) hold(ctx context.Context, l *coordinationv1.Lease, store cache.Store, stop func()) *slotHold {
	h := &slotHold{s: s, name: l.Name, ctx: context.WithoutCancel(ctx), store: store, stop: stop, last: l, renewed: s.Clock.Now(),
		done: make(chan struct{}), stopped: make(chan struct{}), gone: make(chan struct{})}
	s.mu.Lock()
	s.cur = h
	s.mu.Unlock()
	go h.loop(ctx)
	return h
}

// renewEvery is the renewal period: a third of the duration (client-go's
// leader election renews well within its lease too).
func (h *slotHold) renewEvery() time.Duration { return max(h.s.Duration/3, time.Second) }

func (h *slotHold) loop(ctx context.Context) {
	defer close(h.stopped)
	for {
		select {
		case <-h.done:
			return
		case <-ctx.Done():
			return
		case <-h.s.Clock.After(h.renewEvery()):
			h.mu.Lock()
			idle := h.keep || h.lost != nil // stretched for the reboot, or gone
			h.mu.Unlock()
			if idle {
				continue
			}
			if err := h.renew(h.ctx); err != nil {
				h.s.Log.Warn("renewing the rollout slot failed", "lease", h.name, "err", err)
			}
		}
	}
}

// renew writes the Lease as last written, renewed: one request. A conflict
// reads it: still this holder's (written by ExtendForReboot) is renewed
// again; another's means the slot is lost. A failure for longer than the
// lease duration loses it too. It returns the failure, nil when renewed.
func (h *slotHold) renew(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lost != nil {
		return h.lost
	}
	leases := h.s.Client.CoordinationV1().Leases(h.s.Namespace)
	sent := h.s.Clock.Now()
	got, err := leases.Update(ctx, h.s.claim(h.freshestLocked()), metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		var cur *coordinationv1.Lease
		cur, err = leases.Get(ctx, h.name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			// Deleted while held (an operator unsticking a rollout): this
			// node is still disrupted, so the slot is made again for it;
			// the waiting nodes do not take it meanwhile (Slots.freed).
			got, err = leases.Create(ctx, h.s.claim(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: h.name, Namespace: h.s.Namespace}}), metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return h.lose(fmt.Errorf("rollout slot %s was deleted and made again by another", h.name))
			}
			if err == nil {
				h.s.Log.Warn("the rollout slot was deleted while held; made it again for this node", "lease", h.name)
				h.shown = false
			}
		case err == nil && ptr.Deref(cur.Spec.HolderIdentity, "") != h.s.Holder:
			return h.lose(fmt.Errorf("rollout slot %s is held by %q now", h.name, ptr.Deref(cur.Spec.HolderIdentity, "")))
		case err == nil:
			got, err = leases.Update(ctx, h.s.claim(cur), metav1.UpdateOptions{})
		}
	}
	if err != nil {
		if since := h.s.Clock.Since(h.renewed); since >= h.s.Duration {
			return h.lose(fmt.Errorf("rollout slot %s not renewed for %s (another node may have taken it): %w", h.name, since.Round(time.Second), err))
		}
		return err
	}
	h.last, h.renewed = got, sent
	return nil
}

// Check confirms the slot before a disruptive step: nil while the last
// successful renewal is recent enough to vouch for it (within half the
// lease duration: no request), else it renews now and answers with that.
// A renewal that fails for a passing cause while the slot is still within
// its duration does not lose it.
func (h *slotHold) Check(ctx context.Context) error {
	h.mu.Lock()
	lost, fresh := h.lost, h.s.Clock.Since(h.renewed) < h.s.Duration/2 && h.agrees()
	keep := h.keep
	h.mu.Unlock()
	if lost != nil {
		return lost
	}
	if fresh || keep {
		return nil
	}
	err := h.renew(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lost != nil {
		return h.lost
	}
	if err != nil {
		h.s.Log.Warn("renewing the rollout slot failed; it is still within its duration", "lease", h.name, "err", err)
	}
	return nil
}

// agrees: the watch shows the slot as this holder's, or is behind this
// holder's last write (an older version; absent, within a second of a
// write it has not shown yet), or there is no watch. A slot it shows
// deleted or taken by another is confirmed with a write before the next
// step (Check), whatever the last renewal vouches. h.mu is held.
func (h *slotHold) agrees() bool {
	if h.store == nil {
		return true
	}
	l := h.s.cached(h.store, h.name)
	if l == nil { // unless the watch is behind this holder's write
		return !h.shown && h.s.Clock.Since(h.renewed) < time.Second
	}
	if c, err := resourceversion.CompareResourceVersion(l.ResourceVersion, h.last.ResourceVersion); err == nil && c < 0 {
		return true // the watch is behind this holder's last write
	}
	h.shown = true
	return holder(l) == h.s.Holder
}

// mend renews the slot at once when the watch shows it deleted (made again
// for this holder) or taken by another (lost: the change stops before its
// next step), instead of at the next renewal.
func (h *slotHold) mend() {
	h.mu.Lock()
	ok := h.lost != nil || h.keep || h.agrees()
	h.mu.Unlock()
	if !ok {
		if err := h.renew(h.ctx); err != nil {
			h.s.Log.Warn("renewing the rollout slot failed", "lease", h.name, "err", err)
		}
	}
}

// extend stretches the Lease for the reboot (see ExtendForReboot).
func (h *slotHold) extend(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lost != nil {
		return h.lost
	}
	leases := h.s.Client.CoordinationV1().Leases(h.s.Namespace)
	l, err := leases.Get(ctx, h.name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("rollout slot %s: %w", h.name, err)
	}
	if holder := ptr.Deref(l.Spec.HolderIdentity, ""); holder != h.s.Holder {
		return h.lose(fmt.Errorf("rollout slot %s is held by %q now", h.name, holder))
	}
	secs := int32(h.s.longest() / time.Second)
	now := metav1.NewMicroTime(h.s.Clock.Now())
	l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &secs, &now
	got, err := leases.Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("rollout slot %s: %w", h.name, err)
	}
	h.last, h.keep = got, true
	return nil
}

// Release stops renewing the slot and frees it, if this holder still holds
// it; a slot kept for a reboot, or kept by the caller (a change parked by a
// shutdown), stays taken: the holder's node counts against the bound until
// its agent, back, takes it again (a holder always may take its own).
func (h *slotHold) Release(keepIt bool) {
	select {
	case <-h.done:
		return // released already
	default:
	}
	close(h.done)
	<-h.stopped
	defer h.stop()
	s := h.s
	s.mu.Lock()
	if s.cur == h {
		s.cur = nil
	}
	s.mu.Unlock()
	h.mu.Lock()
	keep, lost := h.keep, h.lost
	h.mu.Unlock()
	switch {
	case keep:
		s.Log.Info("keeping the rollout slot through the reboot", "lease", h.name, "for", s.longest())
		return
	case keepIt && lost == nil:
		s.Log.Info("keeping the rollout slot: the change is parked mid-disruption", "lease", h.name)
		return
	case lost != nil:
		s.Log.Warn("the rollout slot was lost; nothing to release", "lease", h.name, "err", lost)
		s.leaveOthers(h.ctx, h.store, h.name)
		h.settle(false)
		return
	}
	// Out of the queues it still stands in, before the slot goes: once it
	// holds none, their holders would hand it theirs.
	s.leaveOthers(h.ctx, h.store, h.name)
	// One write, from the Lease as last seen: handed to the first
	// node of its queue, or released; only a conflict reads it first.
	to, err := s.handOver(h.ctx, h.freshest(), h.store)
	defer h.settle(err == nil)
	switch {
	case errors.Is(err, errNotHolder):
		s.Log.Warn("the rollout slot is held by another; not releasing it", "lease", h.name, "err", err)
	case err != nil:
		s.Log.Warn("releasing the rollout slot failed; it expires by itself", "lease", h.name, "err", err)
	case to != "":
		s.Log.Info("handed the rollout slot to the next node of its queue", "lease", h.name, "to", to)
	default:
		s.Log.Info("released rollout slot", "lease", h.name)
	}
}

// strays hands on, while this node holds its slot, any other slot handed
// to it: two holders that saw it waiting at once, before either's write
// reached the other's cache. Its watch says so (changed).
func (h *slotHold) strays() {
	for {
		select {
		case <-h.done:
			return
		case <-h.changed:
		}
		h.s.handOnOthers(h.ctx, h.store, h.name)
		select {
		case <-h.done:
			return
		default:
			h.mend()
		}
	}
}

// strayWait bounds how long a release waits for its watch to show its own
// hand-off (settle).
const strayWait = 2 * time.Second

// settle, at the release, hands on a slot handed to this node while it
// held its own that its watch had not shown yet (strays ends with the
// hold): once the watch shows the release's own write, it shows every
// write before it, the stray one too. Nobody else would hand that slot
// on: its queue would wait on it until it expired. Without a write of its
// own (the slot lost, or the write failed), with what the watch shows now.
func (h *slotHold) settle(written bool) {
	if h.store == nil {
		return
	}
	shown := func() bool { l := h.s.cached(h.store, h.name); return l == nil || holder(l) != h.s.Holder }
	for wait := h.s.Clock.After(strayWait); written && !shown(); {
		select {
		case <-h.changed:
		case <-wait:
			written = false
		}
	}
	h.s.handOnOthers(h.ctx, h.store, h.name)
}

// freshest is the slot as this holder last wrote it, or as the watch shows
// it when that is newer (the same record of this holder, later writes of
// the queue on top).
func (h *slotHold) freshest() *coordinationv1.Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.freshestLocked()
}

func (h *slotHold) freshestLocked() *coordinationv1.Lease {
	last := h.last
	if h.store == nil {
		return last.DeepCopy()
	}
	if l := h.s.cached(h.store, h.name); l != nil && leaseobs.Record(l) == leaseobs.Record(last) {
		return l.DeepCopy()
	}
	return last.DeepCopy()
}
