package reconcile

import (
	"context"
	"time"

	"github.com/migagent/mig-agent/internal/backoff"
)

// outageRetry bounds how long a drain rides out an API server outage.
const outageRetry = 2 * time.Minute

// evict evicts pods and, while the API server is away, evicts them again
// (Disruptor.Evict is safe to repeat: pods already gone count as evicted,
// terminating ones are waited for), for up to outageRetry: an outage in
// the middle of a drain is no reason to fail the change.
func (d *Daemon) evict(ctx context.Context, pods []string) ([]string, error) {
	var evicted []string
	err := backoff.Retry(ctx, d.Clock, outageRetry, d.Cluster.API().Transient, func(err error) {
		d.Log.Warn("the API server is away during the drain; evicting again", "err", err)
	}, func() error {
		more, err := d.Disrupt.Evict(ctx, pods)
		evicted = appendNew(evicted, more...)
		return err
	})
	return evicted, err
}
