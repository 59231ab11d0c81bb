package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/cache"

	"github.com/migagent/mig-agent/internal/backoff"
	"github.com/migagent/mig-agent/reconcile"
)

// Acquire blocks until a slot is taken (or ctx ends) and returns it. The
// node's place in line (AnnotationTicket) is when it first sees the slots
// (its watch synced): the queues serve first come, first served.
// While it waits it holds one watch on the slot Leases and sends nothing
// else: a try follows a Lease change or an expiry, and only when the cache
// shows a slot free (released, expired, absent, or this holder's own).
func (s *Slots) Acquire(ctx context.Context) (reconcile.Slot, error) {
	if s.Percent > 0 {
		n, pool, err := s.PoolShare(ctx)
		if err != nil {
			return nil, fmt.Errorf("counting the agents for --max-concurrent %d%%: %w", s.Percent, err)
		}
		s.Log.Debug("rollout slots from the pool", "percent", s.Percent, "agents", pool, "slots", n)
		s.N = n
	}
	w, err := s.newWaiter(ctx)
	if err != nil {
		return nil, err
	}
	slot, err := w.wait()
	if slot == nil && w.q.on != "" {
		s.leaveQueue(ctx, w.q.on) // gave up waiting
	}
	return slot, err
}

// waiter is one Acquire's wait for a slot: its watch of the slot Leases,
// where it stands in the queues, and what it saw of the slots so far.
type waiter struct {
	s       *Slots
	ctx     context.Context
	store   cache.Store   // the slots as the watch shows them
	changed chan struct{} // the watch saw a change
	stop    func()        // ends the watch
	unlink  func() bool   // keeps the watch past ctx (a slot was taken)

	q         queued // the queue this node joined
	hand      handOffs
	retries   *backoff.Backoff
	logged    bool                 // the wait was logged
	exists    map[string]bool      // created by another while absent from the cache
	seenFree  map[string]time.Time // when this node first saw each slot free
	seenRoom  map[string]roomSeen  // when it first saw a place in a slot's queue
	lost      map[string]lostRace  // per slot, the version a race was lost on
	recounted map[string]string    // per slot, the version a late turn was counted again for

	// This round's look at the cache (wait).
	now      time.Time
	window   time.Duration // the turn window every queued node shares
	roomOn   string        // a queue with a place for this node ("": none)
	roomWait time.Duration // the wait before its turn to join roomOn
}

// newWaiter starts the watch of the slots and puts this node in line. The
// watch outlives the wait when a slot is taken: the holder's hand-off
// reads the queue from it (slotHold.Release stops it).
func (s *Slots) newWaiter(ctx context.Context) (*waiter, error) {
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	unlink := context.AfterFunc(ctx, stop)
	changed := make(chan struct{}, 1)
	store, err := s.watch(wctx, changed)
	if err != nil {
		stop()
		return nil, err
	}
	// In line from the first look: a node is known to the others only from
	// then on, and a node that asked first is served first.
	s.ticket.Store(s.Clock.Now().UnixMilli())
	return &waiter{s: s, ctx: ctx, store: store, changed: changed, stop: stop, unlink: unlink,
		hand:    handOffs{window: s.spread(), freed: map[string]time.Time{}},
		retries: backoff.API(), exists: map[string]bool{}, seenFree: map[string]time.Time{},
		seenRoom: map[string]roomSeen{}, lost: map[string]lostRace{}, recounted: map[string]string{}}, nil
}

// wait looks at the cache after every change, turn, expiry or retry until
// a slot is this node's: handed to it, or taken at its turn. Otherwise it
// joins a queue with a place, at its turn to join, and sends nothing else.
func (w *waiter) wait() (reconcile.Slot, error) {
	for {
		w.now = w.s.Clock.Now()
		// A slot handed to this node by its last holder is this node's,
		// without a request.
		if l := w.s.handed(w.ctx, w.store); l != nil {
			w.s.Log.Info("took rollout slot", "lease", l.Name, "handedBy", "its last holder")
			return w.held(l), nil
		}
		w.q.track(w.s, w.store, w.now)
		w.hand.observe(w.store, w.s.Namespace, w.s.N, w.s.Holder, w.now)
		free, next := w.s.scan(w.ctx, w.store)
		w.window = w.hand.shared(w.store, w.s.Namespace, w.s.N)
		w.roomOn, w.roomWait = "", 0
		if w.mayJoin() {
			w.roomOn, w.roomWait = w.s.room(w.store, w.window, w.seenRoom, w.now)
		}
		pick, wait := w.choose(free)
		trouble := false // an error or a lost race: look again after a jittered wait
		var turn <-chan time.Time
		switch {
		case pick != nil && wait > 0:
			turn = w.s.Clock.After(wait)
		case pick != nil:
			got, failed := w.take(pick)
			if got != nil {
				w.s.Log.Info("took rollout slot", "lease", pick.name)
				return w.held(got), nil
			}
			trouble = failed
		}
		joinTurn, failed := w.joinRoom(pick)
		trouble = trouble || failed
		if !w.logged {
			w.s.Log.Info("all rollout slots taken; waiting", "slots", w.s.N, "queue", w.q.on)
			w.logged = true
		}
		if err := w.sleep(trouble, next, turn, joinTurn); err != nil {
			return nil, err
		}
	}
}

// mayJoin: this node is in no queue yet, and may join one.
func (w *waiter) mayJoin() bool { return w.q.on == "" && !w.q.off }

// held starts holding slot l. Served by another slot (a free one, or
// handed on from another queue), this node stays in the queue it joined
// while it holds: nobody hands it that slot meanwhile (a holder skips the
// nodes that hold a slot), and that queue's holder removes the entry in
// its own hand-off, a write it sends anyway. The release leaves what is
// still there (leaveOthers). So a hand-off across queues costs no request
// of its own.
func (w *waiter) held(l *coordinationv1.Lease) reconcile.Slot {
	w.unlink()
	h := w.s.hold(w.ctx, l, w.store, w.stop)
	h.changed = w.changed
	go h.strays()
	return h
}

// choose is the free slot this node goes for, and the wait before its turn
// (nil: none). Every queued node sees the same slots freed at about the
// same moment and tries each in an order all of them agree on (Slots.turn),
// counted from that moment, over the window they all share: the first in
// that order takes the slot, and the others see it taken in their caches
// before their turn, without a request. This node goes for the free slot
// where its turn comes first; its own slot (kept through a reboot) at once.
func (w *waiter) choose(free []candidate) (pick *candidate, wait time.Duration) {
	isFree := map[string]bool{}
	for i := range free {
		c := &free[i]
		isFree[c.name] = true
		d, ok := w.turnFor(c)
		if ok && (pick == nil || d < wait) {
			pick, wait = c, d
		}
	}
	for name := range w.seenFree {
		if !isFree[name] {
			delete(w.seenFree, name)
		}
	}
	return pick, wait
}

// turnFor is the wait before this node's turn for free slot c, counted
// from when it first saw c free; false when it does not try c now: c was
// created a moment ago by another while this node is in its queue, a race
// for c's version was lost and the winner's write is on its way to the
// cache, or c was never made while the queue this node is in serves it
// next.
func (w *waiter) turnFor(c *candidate) (time.Duration, bool) {
	if c.lease == nil && w.exists[c.name] && w.q.on == c.name {
		return 0, false
	}
	if l, ok := w.lost[c.name]; ok && c.lease != nil && c.lease.ResourceVersion == l.rv && w.now.Before(l.until) {
		return 0, false
	}
	at, ok := w.seenFree[c.name]
	if !ok {
		at, w.seenFree[c.name] = w.now, w.now
	}
	if c.lease == nil && w.q.on != "" {
		// Never made, as the cache shows it, while this node is queued:
		// while slots are still being made (the start of a pool-wide
		// change) it is another node's home slot and a create would
		// likely lose. Once none has been made for a while it is nobody's
		// home (fewer nodes than slots hash to some): it is made in turn,
		// lest the pool run on fewer slots than N, by a node with another
		// ahead of it in its queue (the next of a queue goes next anyway).
		if w.s.nextInQueue(w.store, w.q.on) {
			return 0, false
		}
		at = later(at, w.hand.lastMade)
	}
	turn := w.slotTurn(c)
	d := turn - w.now.Sub(at)
	if rv := slotVersion(c); d < -lateTurn && w.recounted[c.name] != rv {
		// Long after its turn: its process or its watch was held up (a
		// loaded machine), so its cache is likely behind the slot's taker.
		// It counts its turn again from now instead of trying at once
		// with the others held up too; once a slot version, so that a
		// node always late still tries.
		w.seenFree[c.name], d, w.recounted[c.name] = w.now, turn, rv
	}
	if holder(c.lease) == w.s.Holder {
		d = 0
	}
	return d, true
}

// slotTurn is this node's turn for free slot c, from when it was freed.
// Each node has a home slot (Slots.home), tried first by the nodes whose
// home it is, over the window, and by the others only after it, so that
// when many slots are free at once (a pool-wide change) about K/N nodes
// race for each, not all K for all N; a node with a queue as its way in
// waits one window more. A freed slot that has a queue (its holder did not
// see it) goes to its queue first, in the queue's order, a HandOffGap
// apart; then to the others.
func (w *waiter) slotTurn(c *candidate) time.Duration {
	turn := w.s.turn(*c, w.window)
	if c.name != w.s.home() {
		turn += w.window
		if w.q.on != "" || w.roomOn != "" {
			turn += w.window
		}
	}
	if cq := queueOf(c.lease); len(cq) > 0 {
		if pos := w.s.queuePos(cq); pos >= 0 {
			turn = time.Duration(pos) * HandOffGap
		} else {
			turn += w.window
		}
	}
	return turn
}

// take tries pick, at this node's turn: one try a round. The take of a
// freed slot carries the window for the slot's next hand-off; a slot's
// first take (its create) was no hand-off, and moves no window. It returns
// the slot as written, or failed when the round met an error or lost the
// race (the next look comes after a jittered wait).
func (w *waiter) take(pick *candidate) (got *coordinationv1.Lease, failed bool) {
	if holder(pick.lease) == "" {
		if ok, _ := w.s.freed(w.ctx, pick.name); !ok {
			return nil, true // its last holder is mid-change: looked at again later
		}
	}
	if pick.lease != nil {
		w.s.window = w.hand.next(w.window, w.s.order(*pick))
	}
	got, err := w.s.take(w.ctx, pick.name, pick.lease, w.exists[pick.name])
	switch {
	case got != nil:
		return got, false
	case errors.Is(err, errSlotExists):
		// Created a moment ago by another node (its write is on its way
		// to the cache): this node queues behind it instead of racing for
		// another slot.
		w.exists[pick.name] = true
		return nil, !w.joinBehind(pick.name)
	case err != nil:
		w.s.Log.Debug("rollout slot", "lease", pick.name, "err", err)
		return nil, true
	default:
		// Another node won it. Until its write reaches the cache, the
		// cached version is not tried again.
		if pick.lease != nil {
			w.lost[pick.name] = lostRace{rv: pick.lease.ResourceVersion, until: w.now.Add(lostRaceHold)}
		}
		return nil, true
	}
}

// joinBehind joins the queue of slot name, just created by another node,
// when this node may join one; it reports whether it joined.
func (w *waiter) joinBehind(name string) bool {
	if !w.mayJoin() {
		return false
	}
	rv, err := w.s.join(w.ctx, name)
	if err != nil {
		return false
	}
	w.q.joined(name, rv, w.now)
	return true
}

// joinRoom joins the queue that has a place for this node (roomOn) when no
// free slot is this node's (pick is none, or another node's home slot): at
// once at its turn, else joinTurn fires at its turn. failed: the join
// failed (look again after a jittered wait).
func (w *waiter) joinRoom(pick *candidate) (joinTurn <-chan time.Time, failed bool) {
	if !w.mayJoin() || pick != nil && (pick.name == w.s.home() || holder(pick.lease) == w.s.Holder) {
		return nil, false
	}
	switch {
	case w.roomOn == "":
		return nil, false
	case w.roomWait > 0:
		return w.s.Clock.After(w.roomWait), false
	}
	rv, err := w.s.join(w.ctx, w.roomOn)
	switch {
	case apierrors.IsForbidden(err):
		// An RBAC from before the queue (no patch of Leases): wait for a
		// freed slot, without a queue.
		w.s.Log.Warn("cannot join a rollout slot queue; waiting for a freed slot instead", "err", err)
		w.q.off = true
	case err != nil:
		w.s.Log.Debug("joining a rollout slot queue", "err", err)
		return nil, true
	default:
		w.q.joined(w.roomOn, rv, w.now)
		w.s.Log.Debug("joined a rollout slot queue", "lease", w.roomOn, "ticket", w.s.ticket.Load())
	}
	return nil, false
}

// sleep waits for the next look: a change of the slots, this node's turn
// for a slot or to join a queue, the earliest held slot's expiry (next;
// expiry makes no watch event), or a jittered retry after trouble. It
// returns ctx's error when ctx ends.
func (w *waiter) sleep(trouble bool, next time.Time, turn, joinTurn <-chan time.Time) error {
	var retry, expiry <-chan time.Time
	if trouble {
		retry = w.s.Clock.After(w.retries.Step())
	} else {
		w.retries = backoff.API()
	}
	if !next.IsZero() {
		expiry = w.s.Clock.After(max(next.Sub(w.s.Clock.Now()), 0) + time.Millisecond)
	}
	select {
	case <-w.ctx.Done():
		return w.ctx.Err()
	case <-w.changed:
	case <-turn:
	case <-joinTurn:
	case <-expiry:
	case <-retry:
	}
	return nil
}
