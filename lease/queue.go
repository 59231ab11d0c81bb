package lease

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// The queue of the rollout slots. A node that finds every slot held joins
// the queue of one of them: it adds its own annotation to that slot Lease
// with a merge patch (no resourceVersion: two nodes joining at once do not
// conflict, the API server applies both). The holder, when it is done,
// hands the slot to the first node of its queue in the same write that
// would have released it: the holder becomes that node, and its queue
// entry goes. The node sees its name on the slot in its watch and goes on,
// without a request. So a queued node costs two slot Lease requests (its
// join and, later, its own hand-off), and a hand-off costs one write and
// one watch event, whatever the length of the queue: nobody races for a
// slot that has a queue.
//
// A holder whose own queue is empty takes the last node of the longest
// other queue (two nodes or more), so that the queues, joined at random
// among the shortest, end together. That node leaves its first queue
// itself (one more request).
const (
	// QueueKeyPrefix starts the annotation keys of a slot's queue: one key
	// a queued node, QueueKeyPrefix + 20 hex digits of the SHA-256 of its
	// name, valued "SEQ NODE". SEQ orders the queue (one more than the
	// highest the joiner saw; equal ones by key).
	QueueKeyPrefix = "q.migagent.io/"
	// AnnotationHandedTo names the node a slot was handed to, until that
	// node's own first write of the slot (a renewal, its hand-off). While
	// it is there the node may not have seen the slot yet: if the slot
	// then expires, only the node's taint counts as a change under way
	// (holderDisrupted), not its state label.
	AnnotationHandedTo = "migagent.io/handed-to"
)

// queueKey is node's key in a slot's queue.
func queueKey(node string) string {
	sum := sha256.Sum256([]byte(node))
	return QueueKeyPrefix + hex.EncodeToString(sum[:10])
}

// queueEntry is one node of a slot's queue.
type queueEntry struct {
	key, node string
	seq       int64
}

// queueOf is slot l's queue, the first to be served first (by SEQ, then
// key). An entry whose value does not parse, or whose key is not its
// node's, is ignored.
func queueOf(l *coordinationv1.Lease) []queueEntry {
	if l == nil {
		return nil
	}
	var q []queueEntry
	for k, v := range l.Annotations {
		if !strings.HasPrefix(k, QueueKeyPrefix) {
			continue
		}
		seq, node, ok := strings.Cut(v, " ")
		n, err := strconv.ParseInt(seq, 10, 64)
		if !ok || err != nil || node == "" || queueKey(node) != k {
			continue
		}
		q = append(q, queueEntry{key: k, node: node, seq: n})
	}
	slices.SortFunc(q, func(a, b queueEntry) int { return cmp.Or(cmp.Compare(a.seq, b.seq), cmp.Compare(a.key, b.key)) })
	return q
}

// holder is the holder of l ("" when released).
func holder(l *coordinationv1.Lease) string { return ptr.Deref(l.Spec.HolderIdentity, "") }

// cached is slot i as the cache shows it (nil: absent).
func (s *Slots) cached(store cache.Store, name string) *coordinationv1.Lease {
	obj, ok, _ := store.GetByKey(s.Namespace + "/" + name)
	if !ok {
		return nil
	}
	return obj.(*coordinationv1.Lease)
}

// holding is the set of nodes the cache shows holding a slot.
func (s *Slots) holding(store cache.Store) map[string]bool {
	hs := map[string]bool{}
	for i := range s.N {
		if l := s.cached(store, SlotLeaseName(i)); l != nil && holder(l) != "" {
			hs[holder(l)] = true
		}
	}
	return hs
}

// handed is a slot the cache shows handed to this node (nil: none). A
// second one (two holders handed on at once) is handed on at once.
func (s *Slots) handed(ctx context.Context, store cache.Store) *coordinationv1.Lease {
	var got *coordinationv1.Lease
	for i := range s.N {
		l := s.cached(store, SlotLeaseName(i))
		if l == nil || holder(l) != s.Holder || l.Annotations[AnnotationHandedTo] != s.Holder {
			continue
		}
		if got == nil {
			got = l
			continue
		}
		if to, err := s.handOver(ctx, l, store); err != nil {
			s.Log.Warn("handing on a second rollout slot failed; it expires by itself", "lease", l.Name, "err", err)
		} else {
			s.Log.Info("handed on a second rollout slot", "lease", l.Name, "to", to)
		}
	}
	return got
}

// queuedOn is the slot whose queue, as the cache shows it, holds this
// node ("" when none).
func (s *Slots) queuedOn(store cache.Store) string {
	key := queueKey(s.Holder)
	for i := range s.N {
		if l := s.cached(store, SlotLeaseName(i)); l != nil {
			if _, ok := l.Annotations[key]; ok {
				return l.Name
			}
		}
	}
	return ""
}

// queuePos is this node's place in slot l's queue (-1: not in it).
func (s *Slots) queuePos(q []queueEntry) int {
	return slices.IndexFunc(q, func(e queueEntry) bool { return e.node == s.Holder })
}

// enqueue joins the queue of a held slot: one with the fewest queued nodes
// in the cache, chosen at random among those. It returns the slot's name
// ("" when the cache shows no held slot).
func (s *Slots) enqueue(ctx context.Context, store cache.Store) (string, error) {
	var best *coordinationv1.Lease
	var bestQ []queueEntry
	ties := 0
	for _, i := range rand.Perm(s.N) {
		l := s.cached(store, SlotLeaseName(i))
		if l == nil || holder(l) == "" {
			continue
		}
		q := queueOf(l)
		switch {
		case best == nil || len(q) < len(bestQ):
			best, bestQ, ties = l, q, 1
		case len(q) == len(bestQ):
			ties++ // reservoir: each of the shortest alike
			if rand.IntN(ties) == 0 {
				best, bestQ = l, q
			}
		}
	}
	if best == nil {
		return "", nil
	}
	seq := int64(1)
	if len(bestQ) > 0 {
		seq = bestQ[len(bestQ)-1].seq + 1
	}
	if err := s.patchQueue(ctx, best.Name, fmt.Sprintf("%d %s", seq, s.Holder)); err != nil {
		return "", err
	}
	return best.Name, nil
}

// dequeue leaves slot name's queue.
func (s *Slots) dequeue(ctx context.Context, name string) error {
	return s.patchQueue(ctx, name, nil)
}

// patchQueue sets this node's queue entry on slot name (nil removes it):
// a merge patch, with no resourceVersion.
func (s *Slots) patchQueue(ctx context.Context, name string, value any) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{queueKey(s.Holder): value}}})
	if err != nil {
		return err
	}
	_, err = s.Client.CoordinationV1().Leases(s.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) && value == nil {
		return nil
	}
	return err
}

// leaveQueue leaves slot name's queue when Acquire gives up waiting (best
// effort: a node that stays in a queue it no longer waits in is handed the
// slot, which then expires unused after a lease duration).
func (s *Slots) leaveQueue(ctx context.Context, name string) {
	if name == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := s.dequeue(ctx, name); err != nil {
		s.Log.Warn("leaving the rollout slot queue failed", "lease", name, "err", err)
	}
}

// successor is the node slot l goes to when its holder is done: the first
// of its queue that holds no slot (as the cache shows them), else the last
// of the longest other queue of two or more ("" when none). key is that
// node's entry on l ("" when it is on another slot).
func (s *Slots) successor(store cache.Store, l *coordinationv1.Lease) (node, key string) {
	hs := s.holding(store)
	waiting := func(q []queueEntry) []queueEntry {
		return slices.DeleteFunc(q, func(e queueEntry) bool { return e.node == s.Holder || hs[e.node] })
	}
	if q := waiting(queueOf(l)); len(q) > 0 {
		return q[0].node, q[0].key
	}
	var longest []queueEntry
	for i := range s.N {
		if o := s.cached(store, SlotLeaseName(i)); o != nil && o.Name != l.Name {
			if q := waiting(queueOf(o)); len(q) >= 2 && len(q) > len(longest) {
				longest = q
			}
		}
	}
	if len(longest) > 0 {
		return longest[len(longest)-1].node, ""
	}
	return "", ""
}

// errNotHolder: the slot is held by another now.
var errNotHolder = errors.New("the rollout slot is held by another")

// handOver ends this node's hold of slot l (as last seen): one write that
// hands it to its successor, or releases it when nobody waits. Entries of
// nodes that hold a slot already go in the same write. Only a conflict
// (the queue changed since l) reads the Lease again; it tries three times.
// It returns the node the slot went to ("" released).
func (s *Slots) handOver(ctx context.Context, l *coordinationv1.Lease, store cache.Store) (string, error) {
	leases := s.Client.CoordinationV1().Leases(s.Namespace)
	for try := 0; ; try++ {
		next := l.DeepCopy()
		if next.Annotations == nil {
			next.Annotations = map[string]string{}
		}
		delete(next.Annotations, AnnotationHandedTo)
		delete(next.Annotations, queueKey(s.Holder))
		hs := s.holding(store)
		for _, e := range queueOf(next) {
			if hs[e.node] && e.node != s.Holder {
				delete(next.Annotations, e.key)
			}
		}
		to, key := "", ""
		if store != nil {
			to, key = s.successor(store, next)
		}
		if to != "" {
			now := metav1.NewMicroTime(s.Clock.Now())
			next.Spec.HolderIdentity, next.Spec.AcquireTime, next.Spec.RenewTime = ptr.To(to), &now, &now
			next.Spec.LeaseDurationSeconds = ptr.To(int32(s.Duration / time.Second))
			next.Annotations[AnnotationHandedTo] = to
			if key != "" {
				delete(next.Annotations, key)
			}
		} else {
			next.Spec.HolderIdentity = ptr.To("")
		}
		_, err := leases.Update(ctx, next, metav1.UpdateOptions{})
		if err == nil {
			return to, nil
		}
		if !apierrors.IsConflict(err) || try == 2 {
			return "", err
		}
		if l, err = leases.Get(ctx, l.Name, metav1.GetOptions{}); err != nil {
			return "", err
		}
		if holder(l) != s.Holder {
			return "", fmt.Errorf("%w (%q)", errNotHolder, holder(l))
		}
	}
}

// queued is where Acquire's node stands in the queues.
type queued struct {
	on     string    // the slot whose queue it joined ("": none)
	at     time.Time // when it joined (its patch answered)
	seen   bool      // the cache has shown it there
	served bool      // it has a slot: nothing to leave
	off    bool      // joining is refused (RBAC without patch): never again
}

func (q *queued) joined(on string, now time.Time) { q.on, q.at, q.seen = on, now, false }

// track follows the cache: where shows this node's entry ("": nowhere). An
// entry the cache showed and no longer shows was removed (the slot gone,
// or this node cleaned out as holding a slot); one never shown
// lostRaceHold after the join was lost: either way it joins again.
func (q *queued) track(where string, now time.Time) {
	switch {
	case where != "":
		q.on, q.seen = where, true
	case q.on != "" && (q.seen || now.Sub(q.at) > lostRaceHold):
		q.on, q.seen = "", false
	}
}
