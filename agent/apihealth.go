package agent

import (
	"context"
	"time"

	"k8s.io/client-go/tools/cache"
)

// watchAPIHealth makes /readyz false while the API server is unreachable:
// the Node watch failing is the first sign (the reflector reports every
// failed list and watch), and a probe every second, only while it lasts,
// finds the API server back (any answer, a refusal included, is one).
func (d *Daemon) watchAPIHealth(inf cache.SharedIndexInformer) error {
	return inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		cache.DefaultWatchErrorHandler(ctx, r, err)
		if ctx.Err() == nil && d.apiDown.CompareAndSwap(false, true) {
			d.Log.Warn("the API server is unreachable; not ready until it answers", "err", err)
			go d.awaitAPI(ctx)
		}
	})
}

// awaitAPI probes the API server until it answers, then clears apiDown.
func (d *Daemon) awaitAPI(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.Clock.After(time.Second):
		}
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := d.Kube.GetNode(pctx)
		cancel()
		if err == nil || permanentAPIError(err) {
			d.apiDown.Store(false)
			d.Log.Info("the API server answers again")
			return
		}
	}
}
