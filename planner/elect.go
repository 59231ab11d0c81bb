package planner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/lease/leaseobs"
)

// ErrLostLease: the replica could not renew its Lease in time; another may
// lead now, so this one stops planning.
var ErrLostLease = errors.New("planner lost its Lease")

// Elector keeps one planner active: the replica that holds the Lease
// Name in Namespace plans, the others wait. It follows client-go's leader
// election (k8s.io/client-go/tools/leaderelection, LeaderElector.tryAcquireOrRenew):
// a Lease whose holder has not renewed it for LeaseDuration, as observed
// by this replica's own clock since it last saw the record change
// (leaseobs.Observer, as the agent's rollout slots judge theirs), may be
// taken; the leader renews every RetryPeriod and stops when it could not
// renew for RenewDeadline. It is built on the agent's narrow client
// (client-go's leaderelection package links the whole clientset).
type Elector struct {
	Client        kclient.Interface
	Namespace     string
	Name          string
	Identity      string
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
	Clock         clock.Clock
	Log           *slog.Logger
	// Leading is told when leadership starts and ends (nil: not told).
	Leading func(bool)

	// obs judges the holder's Lease by when this replica saw its record
	// change, on its own clock.
	obs leaseobs.Observer
}

// Run waits for the Lease, then runs lead until ctx ends or the Lease is
// lost (ErrLostLease); it releases the Lease when lead returns.
func (e *Elector) Run(ctx context.Context, lead func(context.Context) error) error {
	for !e.try(ctx) {
		select {
		case <-ctx.Done():
			return nil
		case <-e.Clock.After(e.RetryPeriod):
		}
	}
	e.Log.Info("planner leads", "lease", e.Namespace+"/"+e.Name, "identity", e.Identity)
	e.tell(true)
	defer e.tell(false)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- lead(lctx) }()
	renewed := e.Clock.Now()
	for {
		select {
		case err := <-done:
			e.release()
			return err
		case <-e.Clock.After(e.RetryPeriod):
		}
		if e.try(lctx) {
			renewed = e.Clock.Now()
			continue
		}
		if lctx.Err() == nil && e.Clock.Since(renewed) > e.RenewDeadline {
			cancel()
			<-done
			return fmt.Errorf("%w: not renewed for %s", ErrLostLease, e.RenewDeadline)
		}
	}
}

func (e *Elector) tell(on bool) {
	if e.Leading != nil {
		e.Leading(on)
	}
}

// try takes or renews the Lease; false when another replica holds it.
func (e *Elector) try(ctx context.Context) bool {
	leases := e.Client.CoordinationV1().Leases(e.Namespace)
	now := metav1.NewMicroTime(e.Clock.Now())
	secs := int32(e.LeaseDuration / time.Second)
	l, err := leases.Get(ctx, e.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: e.Name, Namespace: e.Namespace},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &e.Identity, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now}}
		_, err = leases.Create(ctx, l, metav1.CreateOptions{FieldManager: FieldManager})
		return err == nil
	}
	if err != nil {
		e.Log.Debug("planner Lease not read", "err", err)
		return false
	}
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	observedAt := e.obs.Observe(l, e.Clock.Now())
	dur := e.LeaseDuration
	if l.Spec.LeaseDurationSeconds != nil {
		dur = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	if holder != "" && holder != e.Identity && e.Clock.Since(observedAt) < dur {
		return false
	}
	l = l.DeepCopy()
	if holder != e.Identity {
		l.Spec.AcquireTime = &now
		t := int32(1)
		if l.Spec.LeaseTransitions != nil {
			t = *l.Spec.LeaseTransitions + 1
		}
		l.Spec.LeaseTransitions = &t
	}
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &e.Identity, &secs, &now
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{FieldManager: FieldManager})
	return err == nil
}

// release gives the Lease up, so another replica need not wait for it to
// expire.
func (e *Elector) release() {
	ctx, cancel := context.WithTimeout(context.Background(), e.RetryPeriod)
	defer cancel()
	leases := e.Client.CoordinationV1().Leases(e.Namespace)
	l, err := leases.Get(ctx, e.Name, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != e.Identity {
		return
	}
	l = l.DeepCopy()
	empty := ""
	one := int32(1)
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = &empty, &one
	_, _ = leases.Update(ctx, l, metav1.UpdateOptions{FieldManager: FieldManager})
}
