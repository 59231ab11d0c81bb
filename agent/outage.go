package agent

import (
	"context"
	"errors"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// outageRetry bounds how long a drain rides out an API server outage.
const outageRetry = 2 * time.Minute

// transientAPIError reports an error of an API server that is away for a
// moment (restarting, overloaded): refused or reset connections, a
// connection cut mid-answer, 503 and server timeouts.
func transientAPIError(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	return utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err)
}

// evict evicts pods and, while the API server is away, evicts them again
// (Disruptor.Evict is safe to repeat: pods already gone count as evicted,
// terminating ones are waited for), for up to outageRetry: an outage in
// the middle of a drain is no reason to fail the change.
func (d *Daemon) evict(ctx context.Context, pods []string) ([]string, error) {
	evicted, err := d.Disrupt.Evict(ctx, pods)
	deadline := d.Clock.Now().Add(outageRetry)
	for transientAPIError(err) && ctx.Err() == nil && d.Clock.Now().Before(deadline) {
		d.Log.Warn("the API server is away during the drain; evicting again", "err", err)
		select {
		case <-ctx.Done():
			return evicted, err
		case <-d.Clock.After(time.Second):
		}
		var more []string
		more, err = d.Disrupt.Evict(ctx, pods)
		evicted = appendNew(evicted, more...)
	}
	return evicted, err
}
