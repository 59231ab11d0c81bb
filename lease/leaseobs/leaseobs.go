// Package leaseobs judges another holder's Lease by observation: when this
// reader saw its record change, on its own clock.
package leaseobs

import (
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"
)

// Expiry of another holder's Lease is judged as client-go's leader election
// judges it (k8s.io/client-go/tools/leaderelection/leaderelection.go,
// tryAcquireOrRenew: observedRecord and observedTime): by when THIS reader
// saw the Lease's record change, on its own clock, plus the lease duration.
// The holder's renewTime is another machine's clock: compared with the
// reader's, a holder whose clock runs behind would lose its Lease while it
// still works, and a renewTime far in the future (2099) would lock everyone
// out. It is used only as part of the record: any change restarts the
// reader's count.

// observation is when a reader first saw a Lease's record as it is.
type observation struct {
	record string
	at     time.Time
}

// Observer remembers, per Lease, when its record last changed as this
// reader saw it.
type Observer struct {
	mu   sync.Mutex
	seen map[string]observation
}

// Record is what identifies one write of a Lease's holder record: the
// holder, its times and its duration. Other writes (a node joining a
// slot's queue) are not the holder's: they do not restart its count.
func Record(l *coordinationv1.Lease) string {
	var renew, acquire string
	if l.Spec.RenewTime != nil {
		renew = l.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
	}
	if l.Spec.AcquireTime != nil {
		acquire = l.Spec.AcquireTime.UTC().Format(time.RFC3339Nano)
	}
	return fmt.Sprintf("%s|%s|%s|%d", ptr.Deref(l.Spec.HolderIdentity, ""), renew, acquire,
		ptr.Deref(l.Spec.LeaseDurationSeconds, 0))
}

// Observe notes l as seen now and returns when its record was first seen
// as it is.
func (o *Observer) Observe(l *coordinationv1.Lease, now time.Time) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.seen == nil {
		o.seen = map[string]observation{}
	}
	key, rec := l.Namespace+"/"+l.Name, Record(l)
	ob, ok := o.seen[key]
	if !ok || ob.record != rec {
		ob = observation{record: rec, at: now}
		o.seen[key] = ob
	}
	return ob.at
}

// Expiry is when l ends unless its record changes, as this reader judges
// it: first seen as it is, plus its duration (at most longest: a duration
// beyond what any holder writes is not honoured either; none or a negative
// one counts as zero).
func (o *Observer) Expiry(l *coordinationv1.Lease, now time.Time, longest time.Duration) time.Time {
	d := time.Duration(max(ptr.Deref(l.Spec.LeaseDurationSeconds, 0), 0)) * time.Second
	return o.Observe(l, now).Add(min(d, longest))
}
