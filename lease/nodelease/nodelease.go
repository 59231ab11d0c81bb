// Package nodelease is the node Lease: one agent per node in Kubernetes
// mode, across state directories.
package nodelease

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/internal/backoff"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/journal"
	"github.com/migagent/mig-agent/lease/leaseobs"
	"github.com/migagent/mig-agent/record"
)

// NodeLease makes "one agent per node" hold in Kubernetes mode across
// state dirs: the state dir lock (lock.go) stops a second agent on the same
// dir, but a DaemonSet and a systemd unit with different state dirs on one
// node would both act on its label and race on NVML. The agent of a node
// holds the Lease mig-agent-node-<node> in its namespace while it runs; an
// agent that finds it held, unexpired, by another identity refuses to start.
//
// The identity is the state dir (its device and inode), not the process or
// the host name: a restarted agent, a replaced DaemonSet pod (same hostPath)
// or an agent back from a reboot is the same agent and takes its Lease back
// at once; only a second install waits for the first to stop (it releases
// the Lease on shutdown) or for the Lease to expire (NodeLeaseDuration after
// the first stopped renewing it).
type NodeLease struct {
	Client    kclient.Interface
	Namespace string
	Node      string
	// Identity is NodeLeaseIdentity of the state dir; Holder describes the
	// process for the message of the agent that is refused.
	Identity, Holder string
	Duration         time.Duration // default NodeLeaseDuration
	Clock            clock.Clock
	Log              *slog.Logger

	obs leaseobs.Observer
	// op serialises the writes (Keep's renewals, Confirm's re-take); mu
	// guards the fields below, read by Confirm on the core's goroutine.
	op              sync.Mutex
	mu              sync.Mutex
	held, forbidden bool // set by Take and Keep
	// last is the Lease as the last write returned it: a renewal updates it
	// without reading it first (one request), and reads only on a conflict.
	last *coordinationv1.Lease
	// renewed is when the last successful write was sent: until a lease
	// duration after it, no other agent can have judged the Lease expired.
	renewed time.Time
	// lost says why the node is no longer this agent's (nil while it is).
	lost error
	// cache is Keep's watch of the Lease (nil before it started): Confirm
	// reads it instead of the API server while it shows this agent's own
	// last write.
	cache  cache.Store
	synced func() bool
}

// NodeLeaseDuration is how long an unrenewed node Lease keeps another
// agent out. The holder renews it every 2.5 to 3.3 minutes (a random quarter
// to third of that): one request per node each time while idle, about 0.35
// a minute (the kubelet renews its own
// node Lease every 10 seconds).
const NodeLeaseDuration = 10 * time.Minute

// nodeLeaseSkew is how far a node Lease's renewTime may lie from this
// machine's clock and still be honoured as the other holder's word: a
// renewTime further in the future is implausible (the Lease is judged only
// by when this agent saw it change, leaseobs.Observer), and a Lease whose
// renewTime ended more than this long ago is stale at once (its holder
// stopped long ago, even with that much clock skew).
const nodeLeaseSkew = time.Minute

// errImplausibleLease: another identity holds the node Lease with a
// renewTime this agent does not honour; it is taken over once it has not
// changed for its duration.
var errImplausibleLease = errors.New("the node Lease holds an implausible renew time")

// LabelLease marks the agent's node Leases (value "node"); the rollout slot
// Leases do not carry it.
const LabelLease = "migagent.io/lease"

// AnnotationLeaseHolder on a node Lease describes the process holding it.
const AnnotationLeaseHolder = "migagent.io/holder"

// NodeLeaseName is the node Lease's name: mig-agent-node-<node>, or, for a
// node name too long to fit an object name, its prefix and a hash.
func NodeLeaseName(node string) string {
	const prefix = "mig-agent-node-"
	if len(prefix)+len(node) <= 253 {
		return prefix + node
	}
	sum := sha256.Sum256([]byte(node))
	return prefix + node[:253-len(prefix)-17] + "-" + hex.EncodeToString(sum[:8])
}

// NodeLeaseIdentity names the agent by its state dir: the same directory,
// seen from the host or from a container through a hostPath mount, gives
// the same identity.
func NodeLeaseIdentity(stateDir string) (string, error) {
	fi, err := os.Stat(stateDir)
	if err != nil {
		return "", fmt.Errorf("state dir: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "", fmt.Errorf("state dir %s: no device and inode", stateDir)
	}
	return fmt.Sprintf("state-dir-%x-%x", uint64(st.Dev), st.Ino), nil
}

func (l *NodeLease) duration() time.Duration {
	if l.Duration > 0 {
		return l.Duration
	}
	return NodeLeaseDuration
}

// Take takes the node Lease. It returns an error wrapping journal.ErrAnotherAgent
// when another agent holds it. Any other failure is logged and leaves it to
// Keep, which tries again every few seconds until it holds the Lease: an
// API server that is away at start is a degraded state, not a refusal (the
// agent acts on nothing it cannot read from the API server anyway). An
// agent that may not use Leases at all (RBAC of an older install) warns
// once; the state dir lock still holds.
func (l *NodeLease) Take(ctx context.Context) error {
	err := l.write(ctx, false)
	switch {
	case err == nil:
	case errors.Is(err, journal.ErrAnotherAgent):
		return err
	case errors.Is(err, errImplausibleLease):
		l.Log.Warn("another agent's node lease has an implausible renew time; taking it over if it stays unchanged for its duration",
			"lease", NodeLeaseName(l.Node), "err", err)
	case apierrors.IsForbidden(err):
		l.mu.Lock()
		l.forbidden = true
		l.mu.Unlock()
		l.Log.Warn("the agent may not use Leases; the one-agent-per-node check across state dirs is off",
			"lease", NodeLeaseName(l.Node), "err", err)
	default:
		l.Log.Warn("taking the node lease failed; retrying", "lease", NodeLeaseName(l.Node), "err", err)
	}
	return nil
}

// write takes or renews the Lease (renew: from the Lease as last written,
// one request; else, or on any failure, try reads it first) and notes the
// outcome: held, when it was sent, or lost to another agent.
func (l *NodeLease) write(ctx context.Context, renew bool) error {
	l.op.Lock()
	defer l.op.Unlock()
	sent := l.Clock.Now()
	var err error
	if renew {
		err = l.renew(ctx)
	} else {
		err = l.try(ctx)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err == nil:
		l.held, l.renewed, l.lost = true, sent, nil
	case errors.Is(err, journal.ErrAnotherAgent) || errors.Is(err, errImplausibleLease):
		l.held, l.renewed, l.lost = false, time.Time{}, err
	}
	return err
}

// renew writes the Lease as last held, renewed: one request. Any failure
// (a conflict: someone else wrote it) falls back to try, which reads it.
func (l *NodeLease) renew(ctx context.Context) error {
	l.mu.Lock()
	last := l.last
	l.mu.Unlock()
	if last == nil || ptr.Deref(last.Spec.HolderIdentity, "") != l.Identity {
		return l.try(ctx)
	}
	cur := last.DeepCopy()
	now := metav1.NewMicroTime(l.Clock.Now())
	cur.Spec.RenewTime = &now
	got, err := l.Client.CoordinationV1().Leases(l.Namespace).Update(ctx, cur, metav1.UpdateOptions{})
	if err != nil {
		return l.try(ctx)
	}
	l.setLast(got)
	return nil
}

func (l *NodeLease) setLast(got *coordinationv1.Lease) {
	l.mu.Lock()
	l.last = got
	l.mu.Unlock()
}

func (l *NodeLease) try(ctx context.Context) error {
	leases := l.Client.CoordinationV1().Leases(l.Namespace)
	name := NodeLeaseName(l.Node)
	now := metav1.NewMicroTime(l.Clock.Now())
	secs := int32(l.duration() / time.Second)
	l.setLast(nil)
	cur, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		var got *coordinationv1.Lease
		got, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: l.Namespace,
				Labels:      map[string]string{LabelLease: "node", record.LabelNode: l.Node},
				Annotations: map[string]string{AnnotationLeaseHolder: l.Holder}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(l.Identity), LeaseDurationSeconds: &secs,
				AcquireTime: &now, RenewTime: &now},
		}, metav1.CreateOptions{})
		if err == nil {
			l.setLast(got)
		}
		if apierrors.IsAlreadyExists(err) {
			return apierrors.NewConflict(coordinationv1.Resource("leases"), name, err) // lost a race: read again
		}
		return err
	}
	if err != nil {
		return err
	}
	holder := ptr.Deref(cur.Spec.HolderIdentity, "")
	if holder != "" && holder != l.Identity {
		if err := l.othersLive(cur, holder); err != nil {
			return err
		}
		l.Log.Info("taking over the node lease of an agent that stopped renewing it", "lease", name, "previous", holder)
	}
	if holder != l.Identity {
		cur.Spec.AcquireTime = &now
	}
	if cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	cur.Annotations[AnnotationLeaseHolder] = l.Holder
	cur.Spec.HolderIdentity, cur.Spec.LeaseDurationSeconds, cur.Spec.RenewTime = ptr.To(l.Identity), &secs, &now
	got, err := leases.Update(ctx, cur, metav1.UpdateOptions{})
	if err == nil {
		l.setLast(got)
	}
	return err
}

// othersLive says why cur, held by another identity, may not be taken
// (nil: it expired). Expiry is judged by when this agent saw its record
// change (leaseobs.Observer), not by the holder's clock; only a renewTime
// that ended well in the past (nodeLeaseSkew) ends it sooner. A renewTime
// in the future beyond nodeLeaseSkew is not honoured: errImplausibleLease,
// not journal.ErrAnotherAgent, so that the agent stays and takes it over
// once it stayed unchanged.
func (l *NodeLease) othersLive(cur *coordinationv1.Lease, holder string) error {
	now := l.Clock.Now()
	longest := max(l.duration(), NodeLeaseDuration)
	end := l.obs.Expiry(cur, now, longest)
	if !now.Before(end) {
		return nil
	}
	name := NodeLeaseName(l.Node)
	if cur.Spec.RenewTime != nil {
		renew := cur.Spec.RenewTime.Time
		d := min(time.Duration(max(ptr.Deref(cur.Spec.LeaseDurationSeconds, 0), 0))*time.Second, longest)
		switch {
		case renew.After(now.Add(nodeLeaseSkew)):
			return fmt.Errorf("%w: Lease %s/%s is held by %s with renewTime %s, ahead of this machine's clock; taken over unless it changes before %s",
				errImplausibleLease, l.Namespace, name, holder, renew.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339))
		case renew.Add(d + nodeLeaseSkew).Before(now):
			return nil // stopped long ago, whatever the skew
		}
	}
	return fmt.Errorf("%w on node %s: Lease %s/%s is held by %s (%s) until %s unless it is renewed; one agent per node: stop the other one first",
		journal.ErrAnotherAgent, l.Node, l.Namespace, name, holder, cur.Annotations[AnnotationLeaseHolder], end.UTC().Format(time.RFC3339))
}

// Confirm says whether this agent still holds its node, before a
// GPU-mutating step. While Keep's watch of the Lease shows exactly this
// agent's last write, renewed within half the lease duration, that is the
// answer and no request is sent: another agent takes a Lease only after it
// saw it unchanged for the whole duration (othersLive), and a deletion or
// another writer reaches the watch and makes the copy differ. Otherwise it
// reads the Lease (one request). A deleted Lease is taken again; one held
// by another identity, or known lost, is an error. A read that fails is no
// loss while the last renewal is within the lease duration (no other agent
// can have judged it expired yet). An agent that may not use Leases (older
// RBAC) confirms nothing.
func (l *NodeLease) Confirm(ctx context.Context) error {
	l.mu.Lock()
	forbidden, lost, renewed := l.forbidden, l.lost, l.renewed
	l.mu.Unlock()
	if forbidden {
		return nil
	}
	if lost != nil {
		return lost
	}
	if l.confirmedByWatch() {
		return nil
	}
	name := NodeLeaseName(l.Node)
	cur, err := l.Client.CoordinationV1().Leases(l.Namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		l.Log.Warn("the node lease was deleted; taking it again", "lease", name)
		if err := l.write(ctx, false); err != nil {
			return fmt.Errorf("the node lease %s/%s was deleted and could not be taken again: %w", l.Namespace, name, err)
		}
		return nil
	case err != nil:
		if !renewed.IsZero() && l.Clock.Since(renewed) < l.duration() {
			return nil
		}
		return fmt.Errorf("confirming the node lease %s/%s: %w", l.Namespace, name, err)
	}
	if holder := ptr.Deref(cur.Spec.HolderIdentity, ""); holder != l.Identity {
		err := fmt.Errorf("%w on node %s: Lease %s/%s is held by %q (%s)", journal.ErrAnotherAgent, l.Node, l.Namespace, name, holder, cur.Annotations[AnnotationLeaseHolder])
		if holder == "" {
			// Released by someone (an operator): take it again.
			if werr := l.write(ctx, false); werr == nil {
				return nil
			}
		}
		l.mu.Lock()
		l.held, l.lost = false, err
		l.mu.Unlock()
		return err
	}
	return nil
}

// confirmedByWatch: the watch's copy of the Lease is this agent's last
// write (this identity, the same times and resourceVersion), and that write is less than
// half the lease duration old.
func (l *NodeLease) confirmedByWatch() bool {
	l.mu.Lock()
	store, synced, last, renewed := l.cache, l.synced, l.last, l.renewed
	l.mu.Unlock()
	if store == nil || synced == nil || !synced() || last == nil || renewed.IsZero() || l.Clock.Since(renewed) >= l.duration()/2 {
		return false
	}
	obj, ok, err := store.GetByKey(l.Namespace + "/" + NodeLeaseName(l.Node))
	if err != nil || !ok {
		return false
	}
	cur, ok := obj.(*coordinationv1.Lease)
	return ok && ptr.Deref(cur.Spec.HolderIdentity, "") == l.Identity && leaseobs.Record(cur) == leaseobs.Record(last)
}

// Keep renews the Lease every quarter to third of its duration (at random)
// until ctx ends, then
// releases it; until Take or a retry has taken it, it tries every
// nodeLeaseRetry (jittered). It returns an error wrapping journal.ErrAnotherAgent if
// another agent holds it (ours expired while the API server was away, or
// the other one took it while the API server was away at our start): the
// caller stops, as the second agent would have.
//
// A watch of the Lease notices within seconds when it is deleted or
// written by another identity (an operator cleaning Leases, a second
// install): the Lease is then read and taken again at once, or, held by
// another, Keep returns.
func (l *NodeLease) Keep(ctx context.Context) error {
	l.mu.Lock()
	forbidden := l.forbidden
	l.mu.Unlock()
	if forbidden {
		return nil
	}
	defer l.release(context.WithoutCancel(ctx))
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	poked := make(chan struct{}, 1)
	if err := l.watch(wctx, poked); err != nil {
		l.Log.Warn("watching the node lease failed; its loss is noticed at the next renewal", "lease", NodeLeaseName(l.Node), "err", err)
	}
	for {
		// Between a quarter and a third of the duration, at random: agents
		// started together (a pool, a DaemonSet rollout) do not renew in step.
		d := l.duration()
		every := d/4 + rand.N(d/3-d/4+1)
		l.mu.Lock()
		held := l.held
		l.mu.Unlock()
		if !held {
			every = wait.Jitter(nodeLeaseRetry, backoff.Jitter)
		}
		renew := true
		select {
		case <-ctx.Done():
			return nil
		case <-l.Clock.After(every):
		case <-poked:
			renew = false // read it: deleted, or written by another
		}
		err := l.write(ctx, renew)
		switch {
		case err == nil:
		case ctx.Err() != nil:
		case errors.Is(err, journal.ErrAnotherAgent):
			return err
		default:
			l.Log.Warn("renewing the node lease failed; retrying", "lease", NodeLeaseName(l.Node), "err", err)
		}
	}
}

// watch pokes when the node Lease is deleted, or written with another
// holder: an informer on that one Lease (a field selector on its name).
func (l *NodeLease) watch(ctx context.Context, poked chan<- struct{}) error {
	inf := kclient.Watch(l.Client, &coordinationv1.Lease{}, l.Client.CoordinationV1().Leases(l.Namespace),
		kclient.ByName(NodeLeaseName(l.Node)))
	poke := func() {
		select {
		case poked <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(any) { poke() },
		UpdateFunc: func(_, n any) {
			if cur, ok := n.(*coordinationv1.Lease); ok && ptr.Deref(cur.Spec.HolderIdentity, "") != l.Identity {
				poke()
			}
		},
	}); err != nil {
		return err
	}
	l.mu.Lock()
	l.cache, l.synced = inf.GetStore(), inf.HasSynced
	l.mu.Unlock()
	done := kclient.Start(ctx, inf)
	go func() {
		<-done
		l.mu.Lock()
		l.cache, l.synced = nil, nil // stopped: Confirm reads the API server
		l.mu.Unlock()
	}()
	return nil
}

// nodeLeaseRetry is the wait between tries to take the node Lease while it
// is not held yet.
const nodeLeaseRetry = 5 * time.Second

// release gives the Lease up, so that another install may start at once.
func (l *NodeLease) release(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	leases := l.Client.CoordinationV1().Leases(l.Namespace)
	cur, err := leases.Get(ctx, NodeLeaseName(l.Node), metav1.GetOptions{})
	if err != nil || ptr.Deref(cur.Spec.HolderIdentity, "") != l.Identity {
		return
	}
	cur.Spec.HolderIdentity = ptr.To("")
	if _, err := leases.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		l.Log.Warn("releasing the node lease failed; it expires by itself", "lease", cur.Name, "err", err)
	}
}
