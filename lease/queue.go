package lease

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/lease/leaseobs"
)

// The queue of the rollout slots. A node that finds every slot held joins
// the queue of one of them: it adds its own annotation to that slot Lease
// with a merge patch (no resourceVersion: two nodes joining at once do not
// conflict, the API server applies both). The holder, when it is done,
// hands the slot to the first node of its queue in the same write that
// would have released it: the holder becomes that node, and its queue
// entry goes. The node sees its name on the slot in its watch and goes on,
// without a request. So a queued node costs two slot Lease requests (its
// join and, later, its own hand-off), and a hand-off one write and one
// watch event: nobody races for a slot that has a queue.
//
// A queue has a place for a node while fewer than QueueLength of its
// waiting nodes asked before it (ahead): every watcher of the slots
// receives every write of a slot Lease, queue included, so a queue as long
// as the pool would cost the pool's square in bytes at every hand-off. The
// nodes beyond wait without a request. First come, first served: each
// node's place in line is its ticket, when it first saw the slots
// (AnnotationTicket); a queue is ordered by ticket, and when a place opens
// (a hand-off) the waiting nodes join in ticket order (joinTurn), each
// TicketPace times its distance in line from the node just ahead of it:
// the next in line joins first, and the others see the queue full again in
// their caches before their turn. Two that join at once both stay (a join
// never conflicts): a queue may run over, still in ticket order, and a node
// that asked before the ones that overran it still finds a place ahead of
// them.
//
// Joins that come at once overrun the queues by different lengths, so the
// nodes of a long queue would be served a round or more after nodes that
// asked later. A holder therefore hands its slot to a node beyond the first
// of another queue (the first goes next on its own slot) when that node
// asked before its own queue's first and N/2 or more waiting nodes asked
// between them (successor, passedOver); with its own queue empty, to the
// second of any queue of two or more. That node stays in its first queue
// while it holds (holders skip the nodes that hold a slot), and that
// queue's holder removes its entry in its own next hand-off; what is left
// when it releases, it leaves first (Release). So a hand-off across queues
// costs no request of its own. The design history and the measured costs
// are in docs/design/rollout-slots.md.
const (
	// QueueKeyPrefix starts the annotation keys of a slot's queue: one key
	// a queued node, QueueKeyPrefix + 20 hex digits of the SHA-256 of its
	// name, valued "SEQ NODE". SEQ orders the queue, equal ones by key: the
	// joiner's ticket (AnnotationTicket). Agents from before tickets write
	// one more than the highest SEQ they saw (1 in an empty queue); a pool
	// of both still serves each node once, in SEQ order.
	QueueKeyPrefix = "q.migagent.io/"
	// AnnotationHandedTo names the node a slot was handed to, until that
	// node's own first write of the slot (a renewal, its hand-off). A
	// handed slot that expires is judged as any other (holderDisrupted):
	// by every mark of a change its Node shows.
	AnnotationHandedTo = "migagent.io/handed-to"
	// QueueLength is how many nodes a slot's queue takes (see above).
	QueueLength = 2
	// AnnotationTicket on a slot Lease is its holder's place in line: when
	// it first saw the slots (Acquire), in Unix milliseconds by its own
	// clock. Its take writes it, and a hand-off writes its successor's
	// (the SEQ of its queue entry). A clock that is off moves only its own
	// node in line, by as much; the bound on disruption never reads it.
	AnnotationTicket = "migagent.io/ticket"
	// TicketPace is how much later, after a place opens in a queue, a
	// waiting node joins it for each millisecond its ticket is behind the
	// node just ahead of it in line (joinTurn): nodes that asked 10 ms
	// apart join 50 ms apart, about what a write takes to reach the
	// others' caches on a loaded API server. (Two that join closer than
	// that both stay, in ticket order.)
	TicketPace = 5
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

// holder is the holder of l ("" when released or absent).
func holder(l *coordinationv1.Lease) string {
	if l == nil {
		return ""
	}
	return ptr.Deref(l.Spec.HolderIdentity, "")
}

// cached is slot i as the cache shows it (nil: absent).
func (s *Slots) cached(store cache.Store, name string) *coordinationv1.Lease {
	obj, ok, _ := store.GetByKey(s.Namespace + "/" + name)
	if !ok {
		return nil
	}
	return obj.(*coordinationv1.Lease)
}

// holding is the set of nodes the cache shows holding a slot, and the
// queued names lately found to have no Node (liveSuccessor): none of them
// is waiting, and a hand-off removes their entries (holdersQueued).
func (s *Slots) holding(store cache.Store) map[string]bool {
	hs := map[string]bool{}
	s.mu.Lock()
	for name, at := range s.noNode {
		if s.Clock.Since(at) < noNodeHold {
			hs[name] = true
		}
	}
	s.mu.Unlock()
	for i := range s.N {
		if l := s.cached(store, SlotLeaseName(i)); l != nil && holder(l) != "" {
			hs[holder(l)] = true
		}
	}
	return hs
}

// waiting is q without the nodes of hs (they hold a slot already: served
// by another slot, their entry here on its way out) and this node.
func (s *Slots) waiting(q []queueEntry, hs map[string]bool) []queueEntry {
	return slices.DeleteFunc(q, func(e queueEntry) bool { return e.node == s.Holder || hs[e.node] })
}

// handed is a slot the cache shows handed to this node (nil: none). A
// second one (two holders handed on at once) is handed on at once.
func (s *Slots) handed(ctx context.Context, store cache.Store) *coordinationv1.Lease {
	for i := range s.N {
		if l := s.cached(store, SlotLeaseName(i)); s.handedHere(l) {
			s.handOnOthers(ctx, store, l.Name)
			return l
		}
	}
	return nil
}

// handOnOthers hands on every slot the cache shows handed to this node but
// keep.
func (s *Slots) handOnOthers(ctx context.Context, store cache.Store, keep string) {
	for i := range s.N {
		if l := s.cached(store, SlotLeaseName(i)); l != nil && l.Name != keep && s.handedHere(l) {
			s.handOn(ctx, l, store)
		}
	}
}

// handedHere: slot l, as the cache shows it, was handed to this node and
// not handed on by it since (a cache behind its hand-on shows it still).
func (s *Slots) handedHere(l *coordinationv1.Lease) bool {
	if l == nil || holder(l) != s.Holder || l.Annotations[AnnotationHandedTo] != s.Holder {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handedOn[l.Name] != leaseobs.Record(l)
}

// handOn hands on slot l, handed to this node while it has another.
func (s *Slots) handOn(ctx context.Context, l *coordinationv1.Lease, store cache.Store) {
	s.mu.Lock()
	if s.handedOn == nil {
		s.handedOn = map[string]string{}
	}
	s.handedOn[l.Name] = leaseobs.Record(l)
	s.mu.Unlock()
	if to, err := s.handOver(ctx, l, store); err != nil {
		s.Log.Warn("handing on a second rollout slot failed; it expires by itself", "lease", l.Name, "err", err)
	} else {
		s.Log.Info("handed on a second rollout slot", "lease", l.Name, "to", to)
	}
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

// room is a held slot whose queue has a place ("" when none has) and the
// wait before this node's turn to join it (joinTurn, from the line the
// slots show, counted from when this node saw the queue have a place and
// kept while it has one: seenRoom; a hand-off with the place still open
// does not count the turn again, or a node a few turns back would never
// come to its turn while the queue drains). Of the queues with a place,
// the first in an order of the slots that is this node's own (a hash), so
// that nodes joining at about the same moment spread over the queues.
func (s *Slots) room(store cache.Store, window time.Duration, seenRoom map[string]roomSeen, now time.Time) (string, time.Duration) {
	best, first := "", 2.0
	var line []int64
	hs := s.holding(store)
	for i := range s.N {
		name := SlotLeaseName(i)
		l := s.cached(store, name)
		q := queueOf(l)
		line = inLine(line, l, q)
		if holder(l) == "" || s.ahead(s.waiting(q, hs)) >= QueueLength {
			delete(seenRoom, name)
			continue
		}
		if _, ok := seenRoom[name]; !ok {
			seenRoom[name] = roomSeen{at: now}
		}
		if u := unitHash(name, leaseobs.Record(l), s.Holder); u < first {
			best, first = name, u
		}
	}
	if best == "" {
		return "", 0
	}
	slices.Sort(line)
	seen, turn := seenRoom[best], s.joinTurn(line, window, first)
	wait := turn - now.Sub(seen.at)
	if wait < -lateTurn && turn > 0 && !seen.recounted {
		// This node looks long after its turn: its process or its watch
		// was held up (a loaded machine), and its cache likely misses the
		// joins of the nodes that came before it. It counts its turn again
		// from now, once while the queue has a place, instead of joining
		// at once with the others that were held up too.
		seenRoom[best], wait = roomSeen{at: now, recounted: true}, turn
	}
	return best, wait
}

// ahead is how many of the waiting nodes q were in line before this node
// (an earlier ticket; the same, a key before its own): a queue has a place
// for it while fewer than QueueLength are. Joins that came at once overrun
// the queues with nodes that asked later; counting only those ahead lets a
// node that asked first join ahead of them instead of waiting until they
// drained.
func (s *Slots) ahead(q []queueEntry) int {
	t, k := s.ticket.Load(), queueKey(s.Holder)
	n := 0
	for _, e := range q {
		if e.seq < t || e.seq == t && e.key < k {
			n++
		}
	}
	return n
}

// roomSeen: when this node first saw a place in a slot's queue, and
// whether it counted its turn again since.
type roomSeen struct {
	at        time.Time
	recounted bool
}

// joinTurn is how long after a place opens in a queue this node waits to
// join it: TicketPace times its distance in line from the node just ahead
// of it (the latest of line, the tickets of the nodes holding or queued,
// before its own), so that the next in line joins first; at once when no
// node in line is ahead of it. When a node that asked after it is in line
// already, it is being passed over: no more than its distance from that
// node, since the gap to the node ahead is then a lull before its wave and
// would hold it outside while its wave joins ahead of it. A node farther
// than the window (many are waiting, or few after a lull) joins one window
// later each time its distance doubles: still in ticket order, yet a crowd
// far behind spreads over a few windows and does not run the queue dry.
// While the slots show no ticket, every node joins over the window in the
// order u (a hash of the place, alike on every node).
func (s *Slots) joinTurn(line []int64, window time.Duration, u float64) time.Duration {
	if len(line) == 0 {
		return time.Duration(u * float64(window))
	}
	t := s.ticket.Load()
	i, _ := slices.BinarySearch(line, t) // line[:i] are ahead of it
	if i == 0 {
		return 0
	}
	gap := t - line[i-1]
	if i < len(line) {
		// Passed over already: a node that asked after it is in line.
		// Its turn is no farther than that node's distance behind it,
		// not the gap to the one ahead (a lull before its wave): the
		// others of its wave join at once, having someone just ahead.
		gap = min(gap, line[i]-t)
	}
	d := time.Duration(gap) * TicketPace * time.Millisecond
	if d <= window || window <= 0 {
		return d
	}
	// Farther: one window more each time the distance doubles, still in
	// ticket order.
	return window + time.Duration(float64(window)*math.Log2(float64(d)/float64(window)))
}

// inLine appends to line the tickets slot l (queue q) shows, its holder's
// and its queue's; none for a released or absent slot (its last holder's
// ticket is no one's place in line any more).
func inLine(line []int64, l *coordinationv1.Lease, q []queueEntry) []int64 {
	if holder(l) == "" {
		return line
	}
	if t, err := strconv.ParseInt(l.Annotations[AnnotationTicket], 10, 64); err == nil && t > 0 {
		line = append(line, t)
	}
	for _, e := range q {
		if e.seq > 0 {
			line = append(line, e.seq)
		}
	}
	return line
}

// join adds this node to slot name's queue, in its place by ticket. It
// returns the resourceVersion of the slot as the join wrote it.
func (s *Slots) join(ctx context.Context, name string) (string, error) {
	l, err := s.patchQueue(ctx, name, fmt.Sprintf("%d %s", s.ticket.Load(), s.Holder))
	if err != nil {
		return "", err
	}
	return l.ResourceVersion, nil
}

// dequeue leaves slot name's queue.
func (s *Slots) dequeue(ctx context.Context, name string) error {
	_, err := s.patchQueue(ctx, name, nil)
	return err
}

// patchQueue sets this node's queue entry on slot name (nil removes it):
// a merge patch, with no resourceVersion.
func (s *Slots) patchQueue(ctx context.Context, name string, value any) (*coordinationv1.Lease, error) {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{queueKey(s.Holder): value}}})
	if err != nil {
		return nil, err
	}
	l, err := s.Client.CoordinationV1().Leases(s.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) && value == nil {
		return nil, nil
	}
	return l, err
}

// leaveOthers leaves the queue of every slot but keep where the cache
// (store) shows this node (best effort, as leaveQueue): a holder's queue
// entry elsewhere, not yet removed by that slot's holder (handOverPatch).
func (s *Slots) leaveOthers(ctx context.Context, store cache.Store, keep string) {
	if store == nil {
		return
	}
	key := queueKey(s.Holder)
	for i := range s.N {
		if l := s.cached(store, SlotLeaseName(i)); l != nil && l.Name != keep {
			if _, ok := l.Annotations[key]; ok {
				s.leaveQueue(ctx, l.Name)
			}
		}
	}
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
		return
	}
	s.Log.Debug("left the rollout slot queue", "lease", name)
}

// successor is the queue entry of the node slot l goes to when its holder
// is done: the first of its queue that holds no slot (as the cache shows
// them); or a node beyond the first of another queue that asked before
// that one with N/2 or more waiting nodes between them (passedOver; its
// second, or of any queue of two or more when l's queue is empty: queues
// that joins overran by different lengths would serve their nodes out of
// order; that node stays in its first queue while it holds, which the
// hand-offs there clean up: holdersQueued); or the first of another queue
// with N or more between them (its holder holds long). Of up to stealFrom
// such nodes, the earliest ones, one at random: holders done at once do
// not all take the same node. Node "" when none; the key is "" when the entry
// is on another slot.
func (s *Slots) successor(store cache.Store, l *coordinationv1.Lease) queueEntry {
	hs := s.holding(store)
	var next queueEntry
	own := s.waiting(queueOf(l), hs)
	if len(own) > 0 {
		next = own[0]
	}
	var others [][]queueEntry // the other slots' waiting nodes
	var line []int64          // the tickets of every waiting node, sorted
	for i := range s.N {
		o := s.cached(store, SlotLeaseName(i))
		if o == nil || o.Name == l.Name {
			continue
		}
		q := s.waiting(queueOf(o), hs)
		others = append(others, q)
		for _, e := range q {
			line = append(line, e.seq)
		}
	}
	for _, e := range own {
		line = append(line, e.seq)
	}
	slices.Sort(line)
	var behind []queueEntry // the nodes of the other queues passed over
	for _, q := range others {
		if p := s.passedOver(q, next, line); len(p) > 0 {
			behind = append(behind, p...)
			continue
		}
		if len(q) >= 1 && next.node != "" && q[0].seq < next.seq && passedBy(line, q[0].seq, next.seq) >= max(2, s.N) {
			// The first of a queue whose holder is slow: its own holder
			// would serve it next, but a round of nodes that asked after
			// it went first meanwhile. Should that holder hand it the
			// slot too, it hands the second one on at once (handed).
			behind = append(behind, q[0])
		}
	}
	if len(behind) == 0 {
		return next
	}
	slices.SortFunc(behind, func(a, b queueEntry) int { return cmp.Compare(a.seq, b.seq) })
	e := behind[rand.IntN(min(len(behind), stealFrom))]
	s.Log.Debug("handing the rollout slot to a node that waited longer in another queue", "lease", l.Name, "to", e.node)
	e.key = ""
	return e
}

// passedOver are the nodes of another queue q, but its first (its own
// holder serves that one next), that a hand-off to next would pass over:
// each that asked before next with N/2 or more waiting nodes of line (the
// tickets of all, sorted) between them. Beyond a queue's second too: a
// queue that joins overran holds a run of such nodes, in ticket order, and
// holders done at once pick among the earliest of them (successor) rather
// than all its second. With next none (the holder's own queue is empty),
// the queue's second, and a later node when N/2 or more waiting nodes
// asked after it.
func (s *Slots) passedOver(q []queueEntry, next queueEntry, line []int64) []queueEntry {
	var out []queueEntry
	for j := 1; j < len(q); j++ {
		e, to := q[j], next.seq
		if next.node == "" {
			if j == 1 {
				out = append(out, e)
				continue
			}
			to = line[len(line)-1]
		}
		if e.seq >= to || passedBy(line, e.seq, to) < max(1, s.N/2) {
			break // and every later node of q: asked later, passed by fewer
		}
		out = append(out, e)
	}
	return out
}

// passedBy is how many of the tickets of line (sorted) are after from and
// not after to: the nodes in line behind the node of ticket from that a
// hand-off to the node of ticket to would serve before it, or after it in
// ticket order but before it in fact.
func passedBy(line []int64, from, to int64) int {
	i, _ := slices.BinarySearch(line, from+1)
	j, _ := slices.BinarySearch(line, to+1)
	return max(j-i, 0)
}

// stealFrom is how many of the earliest nodes behind the first of other
// queues a holder picks from at random (successor).
const stealFrom = 3

// errNotHolder: the slot is held by another now.
var errNotHolder = errors.New("the rollout slot is held by another")

// handOver ends this node's hold of slot l (as last seen): one write that
// hands it to its successor, or releases it when nobody waits. The write is
// a JSON patch that tests that this node holds the slot (and that the
// successor's entry is as seen), with no resourceVersion: nodes joining the
// queue meanwhile do not make it fail. A failed test reads the Lease
// again; it tries three times. It returns the node the slot went to (""
// released).
func (s *Slots) handOver(ctx context.Context, l *coordinationv1.Lease, store cache.Store) (string, error) {
	leases := s.Client.CoordinationV1().Leases(s.Namespace)
	for try := 0; ; try++ {
		var to queueEntry
		window := time.Duration(0)
		if store != nil {
			if to = s.liveSuccessor(ctx, store, l); to.node != "" {
				window = s.joinWindow(l, store)
			}
		}
		var stale []string
		if store != nil {
			stale = s.holdersQueued(l, store, to)
		}
		patch, err := json.Marshal(handOverPatch(l, s.Holder, to, window, s.Clock.Now(), s.Duration, stale...))
		if err != nil {
			return "", err
		}
		_, err = leases.Patch(ctx, l.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
		if err == nil {
			return to.node, nil
		}
		// A test that failed (422) or a conflict: the Lease is not as
		// seen.
		if !apierrors.IsInvalid(err) && !apierrors.IsConflict(err) || try == 2 {
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

// noNodeHold is how long a queued name found to have no Node is passed
// over without a look (a Node of that name made later joins again).
const noNodeHold = time.Minute

// liveSuccessor is successor among the queued nodes that exist: a queue
// entry is an annotation anyone who may patch the slot Leases can write,
// for a name no Node has; handed the slot, it would leave it idle for a
// lease duration. The successor's Node is read (from the API server's
// cache) before the hand-off; one that is not found is passed over and its
// entry removed with the hand-off. A Node that cannot be read is handed to.
func (s *Slots) liveSuccessor(ctx context.Context, store cache.Store, l *coordinationv1.Lease) queueEntry {
	for range 4 {
		to := s.successor(store, l)
		if to.node == "" {
			return to
		}
		_, err := s.Client.CoreV1().Nodes().Get(ctx, to.node, metav1.GetOptions{ResourceVersion: "0"})
		if !apierrors.IsNotFound(err) {
			return to
		}
		s.Log.Warn("a rollout slot's queue names a node that does not exist; passing it over", "lease", l.Name, "node", to.node)
		s.mu.Lock()
		if s.noNode == nil {
			s.noNode = map[string]time.Time{}
		}
		s.noNode[to.node] = s.Clock.Now()
		s.mu.Unlock()
	}
	return queueEntry{}
}

// holdersQueued are the keys of l's queue entries whose nodes the cache
// shows holding another slot (served elsewhere: they stay queued while
// they hold, Acquire), but this node's and to's: the hand-off removes
// them.
func (s *Slots) holdersQueued(l *coordinationv1.Lease, store cache.Store, to queueEntry) []string {
	hs := s.holding(store)
	var keys []string
	for _, e := range queueOf(l) {
		if hs[e.node] && e.node != s.Holder && e.node != to.node {
			keys = append(keys, e.key)
		}
	}
	return keys
}

// jsonPatchOp is one operation of a JSON patch (RFC 6902): op, path and,
// but for remove, value.
type jsonPatchOp map[string]any

func patchOp(op, path string, value ...any) jsonPatchOp {
	o := jsonPatchOp{"op": op, "path": path}
	if len(value) > 0 {
		o["value"] = value[0]
	}
	return o
}

// annotationPath is the JSON pointer of annotation key.
func annotationPath(key string) string {
	return "/metadata/annotations/" + strings.ReplaceAll(strings.ReplaceAll(key, "~", "~0"), "/", "~1")
}

// handOverPatch is the write that passes slot l from self to the node of
// queue entry to (none: releases it): a test that self holds it; to's
// entry on l, if it is there (to.key), tested and removed; the holder
// record and its ticket; AnnotationHandedTo set (or, as self's own write,
// removed) and self's own entry removed where l shows them; and the
// entries of stale (keys l shows: nodes served by another slot) removed.
func handOverPatch(l *coordinationv1.Lease, self string, to queueEntry, window time.Duration, now time.Time, d time.Duration, stale ...string) []jsonPatchOp {
	key := to.key
	ops := []jsonPatchOp{patchOp("test", "/spec/holderIdentity", self)}
	if _, ok := l.Annotations[queueKey(self)]; ok {
		ops = append(ops, patchOp("remove", annotationPath(queueKey(self))))
	}
	for _, k := range stale {
		if _, ok := l.Annotations[k]; ok && k != key && k != queueKey(self) {
			ops = append(ops, patchOp("remove", annotationPath(k)))
		}
	}
	if to.node == "" {
		if _, ok := l.Annotations[AnnotationHandedTo]; ok {
			ops = append(ops, patchOp("remove", annotationPath(AnnotationHandedTo)))
		}
		return append(ops, patchOp("replace", "/spec/holderIdentity", ""))
	}
	if key != "" {
		ops = append(ops, patchOp("test", annotationPath(key), l.Annotations[key]), patchOp("remove", annotationPath(key)))
	}
	at := metav1.NewMicroTime(now)
	if len(l.Annotations) == 0 {
		// No annotations at all (an empty map is not stored): the map
		// is made, none being there to lose.
		ops = append(ops, patchOp("test", "/metadata/annotations", nil), patchOp("add", "/metadata/annotations", map[string]string{}))
	}
	ops = append(ops,
		patchOp("replace", "/spec/holderIdentity", to.node),
		patchOp("add", "/spec/acquireTime", at),
		patchOp("add", "/spec/renewTime", at),
		patchOp("add", "/spec/leaseDurationSeconds", int32(d/time.Second)),
		patchOp("add", annotationPath(AnnotationHandedTo), to.node),
		patchOp("add", annotationPath(AnnotationTicket), strconv.FormatInt(to.seq, 10)))
	if window > 0 {
		ops = append(ops, patchOp("add", annotationPath(AnnotationTurnWindow), strconv.FormatInt(window.Milliseconds(), 10)))
	}
	return ops
}

// joinWindow is the turn window a hand-off of slot l writes (with its
// acquireTime, the latest take: every waiting node uses it): the window
// over which the nodes waiting for a place spread their turns to join. A
// queue that, after this hand-off, still holds more than QueueLength
// nodes was overrun (nodes joined closer together than their caches could
// show each other's join): twice as wide. One about to run dry (nobody
// left behind the successor) let the next join come too late: half as
// wide. Within [minWindow, maxWindow]; from the window l carries (the
// default spread when none).
func (s *Slots) joinWindow(l *coordinationv1.Lease, store cache.Store) time.Duration {
	cur := (&handOffs{window: s.spread()}).windowFor(l)
	switch left := len(s.waiting(queueOf(l), s.holding(store))) - 1; {
	case left > QueueLength:
		cur *= 2
	case left <= 0:
		cur /= 2
	}
	return min(max(cur, minWindow), maxWindow)
}

// queued is where Acquire's node stands in the queues.
type queued struct {
	on  string    // the slot whose queue it joined ("": none)
	rv  string    // that slot's resourceVersion as the join wrote it
	at  time.Time // when it joined (its patch answered)
	off bool      // joining is refused (RBAC without patch): never again
}

func (q *queued) joined(on, rv string, now time.Time) { q.on, q.rv, q.at = on, rv, now }

// track follows the cache. This node's entry, once written, leaves a
// queue only when the node is handed that slot (seen before track) or
// leaves it itself; so an entry the cache shows gone from a version of
// the slot at or after the join's means the slot was replaced (deleted
// and made again): the node joins again. A cache that does not show the
// join yet is behind. Without comparable resourceVersions, an entry not
// seen lostRaceHold after the join counts as gone.
func (q *queued) track(s *Slots, store cache.Store, now time.Time) {
	if where := s.queuedOn(store); where != "" {
		q.on = where
		return
	}
	if q.on == "" {
		return
	}
	gone := now.Sub(q.at) > lostRaceHold
	if l := s.cached(store, q.on); l != nil {
		if c, err := resourceversion.CompareResourceVersion(l.ResourceVersion, q.rv); err == nil {
			gone = c >= 0
		}
	}
	if gone {
		s.Log.Debug("no longer in the rollout slot queue it joined", "lease", q.on)
		q.on, q.rv = "", ""
	}
}
