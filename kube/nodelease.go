package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/internal/backoff"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/journal"
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

	held, forbidden bool // set by Take, read by Keep (same goroutine order)
	// last is the Lease as the last write returned it: a renewal updates it
	// without reading it first (one request), and reads only on a conflict.
	last *coordinationv1.Lease
}

// NodeLeaseDuration is how long an unrenewed node Lease keeps another
// agent out. The holder renews it every 2.5 to 3.3 minutes (a random quarter
// to third of that): one request per node each time while idle, about 0.35
// a minute (the kubelet renews its own
// node Lease every 10 seconds).
const NodeLeaseDuration = 10 * time.Minute

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
	err := l.try(ctx)
	switch {
	case err == nil:
		l.held = true
	case errors.Is(err, journal.ErrAnotherAgent):
		return err
	case apierrors.IsForbidden(err):
		l.forbidden = true
		l.Log.Warn("the agent may not use Leases; the one-agent-per-node check across state dirs is off",
			"lease", NodeLeaseName(l.Node), "err", err)
	default:
		l.Log.Warn("taking the node lease failed; retrying", "lease", NodeLeaseName(l.Node), "err", err)
	}
	return nil
}

// renew writes the Lease as last held, renewed: one request. Any failure
// (a conflict: someone else wrote it) falls back to try, which reads it.
func (l *NodeLease) renew(ctx context.Context) error {
	if l.last == nil || ptr.Deref(l.last.Spec.HolderIdentity, "") != l.Identity {
		return l.try(ctx)
	}
	cur := l.last.DeepCopy()
	now := metav1.NewMicroTime(l.Clock.Now())
	cur.Spec.RenewTime = &now
	got, err := l.Client.CoordinationV1().Leases(l.Namespace).Update(ctx, cur, metav1.UpdateOptions{})
	if err != nil {
		l.last = nil
		return l.try(ctx)
	}
	l.last = got
	return nil
}

func (l *NodeLease) try(ctx context.Context) error {
	leases := l.Client.CoordinationV1().Leases(l.Namespace)
	name := NodeLeaseName(l.Node)
	now := metav1.NewMicroTime(l.Clock.Now())
	secs := int32(l.duration() / time.Second)
	l.last = nil
	cur, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l.last, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: l.Namespace,
				Labels:      map[string]string{LabelLease: "node", record.LabelNode: l.Node},
				Annotations: map[string]string{AnnotationLeaseHolder: l.Holder}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(l.Identity), LeaseDurationSeconds: &secs,
				AcquireTime: &now, RenewTime: &now},
		}, metav1.CreateOptions{})
		if err != nil {
			l.last = nil
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
		if end := leaseExpiry(cur); l.Clock.Now().Before(end) {
			return fmt.Errorf("%w on node %s: Lease %s/%s is held by %s (%s) until %s unless it is renewed; one agent per node: stop the other one first",
				journal.ErrAnotherAgent, l.Node, l.Namespace, name, holder, cur.Annotations[AnnotationLeaseHolder], end.UTC().Format(time.RFC3339))
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
		l.last = got
	}
	return err
}

// Keep renews the Lease every quarter to third of its duration (at random)
// until ctx ends, then
// releases it; until Take or a retry has taken it, it tries every
// nodeLeaseRetry (jittered). It returns an error wrapping journal.ErrAnotherAgent if
// another agent holds it (ours expired while the API server was away, or
// the other one took it while the API server was away at our start): the
// caller stops, as the second agent would have.
func (l *NodeLease) Keep(ctx context.Context) error {
	if l.forbidden {
		return nil
	}
	defer l.release(context.WithoutCancel(ctx))
	for {
		// Between a quarter and a third of the duration, at random: agents
		// started together (a pool, a DaemonSet rollout) do not renew in step.
		d := l.duration()
		every := d/4 + rand.N(d/3-d/4+1)
		if !l.held {
			every = wait.Jitter(nodeLeaseRetry, backoff.Jitter)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-l.Clock.After(every):
		}
		err := l.renew(ctx)
		switch {
		case err == nil:
			l.held = true
		case ctx.Err() != nil:
		case errors.Is(err, journal.ErrAnotherAgent):
			l.held = false
			return err
		default:
			l.Log.Warn("renewing the node lease failed; retrying", "lease", NodeLeaseName(l.Node), "err", err)
		}
	}
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
