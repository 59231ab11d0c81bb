package agent

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/migagent/mig-agent/internal/backoff"
)

// Slots is a cluster-wide semaphore of N Leases (coordination.k8s.io) in
// the agent's namespace: a node takes one before it evicts or reboots, so
// at most N nodes are disrupted at once. A holder renews its Lease while it
// works; a crashed holder's slot expires after the lease duration.
type Slots struct {
	Client    kubernetes.Interface
	Namespace string
	Holder    string // the node name
	N         int
	Duration  time.Duration
	Clock     clock.Clock
	Log       *slog.Logger
	// Poll is the wait between tries while every slot is taken.
	Poll time.Duration

	mu   sync.Mutex
	held string // the slot Lease taken by Acquire, until released
	keep bool   // ExtendForReboot ran: release keeps the Lease
}

// RebootHold is how long a slot stays taken, unrenewed, while its node
// reboots for a change (ExtendForReboot): the node is disrupted until it is
// back and resumes, which takes its Lease again at once. A node that never
// comes back frees the slot after this long.
const RebootHold = 30 * time.Minute

// SlotLeaseName is the name of slot i.
func SlotLeaseName(i int) string { return fmt.Sprintf("mig-agent-slot-%d", i) }

// Acquire blocks until a slot is taken (or ctx ends) and returns its release.
func (s *Slots) Acquire(ctx context.Context) (func(), error) {
	poll := s.Poll
	if poll <= 0 {
		poll = 2 * time.Second
	}
	logged := false
	for {
		for i := range s.N {
			name := SlotLeaseName(i)
			ok, err := s.try(ctx, name)
			if err != nil {
				s.Log.Debug("rollout slot", "lease", name, "err", err)
				continue
			}
			if ok {
				s.Log.Info("took rollout slot", "lease", name)
				s.mu.Lock()
				s.held, s.keep = name, false
				s.mu.Unlock()
				return s.hold(ctx, name), nil
			}
		}
		if !logged {
			s.Log.Info("all rollout slots taken; waiting", "slots", s.N)
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.Clock.After(wait.Jitter(poll, backoff.Jitter)): // jittered: queued nodes do not ask in step
		}
	}
}

func (s *Slots) try(ctx context.Context, name string) (bool, error) {
	leases := s.Client.CoordinationV1().Leases(s.Namespace)
	now := metav1.NewMicroTime(s.Clock.Now())
	secs := int32(s.Duration / time.Second)
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.Namespace, Labels: map[string]string{LabelManagedBy: "mig-agent"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(s.Holder), LeaseDurationSeconds: &secs,
				AcquireTime: &now, RenewTime: &now},
		}, metav1.CreateOptions{})
		return err == nil, ignoreConflict(err)
	}
	if err != nil {
		return false, err
	}
	holder := ptr.Deref(l.Spec.HolderIdentity, "")
	if holder != "" && holder != s.Holder && !s.expired(l) {
		return false, nil
	}
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = ptr.To(s.Holder), &secs
	l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
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
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return true
	}
	end := l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
	return s.Clock.Now().After(end)
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
