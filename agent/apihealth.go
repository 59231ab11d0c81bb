package agent

import (
	"context"
	"time"

	"k8s.io/client-go/tools/cache"
)

// apiProbeInterval is how often the API server's /readyz is asked while it
// answers (while it does not, every second). As often as the kubelet
// renews its node Lease, and cheaper: /readyz touches no object.
const apiProbeInterval = 10 * time.Second

// watchAPIHealth makes /readyz false while the API server is unreachable.
// Two signs: the Node watch reporting a failed list or watch, and a probe
// of the API server's own /readyz. The probe is needed because the
// reflector retries a refused watch connection quietly, reporting nothing,
// so a watch can be dead for minutes without a word.
func (d *Daemon) watchAPIHealth(ctx context.Context, inf cache.SharedIndexInformer) error {
	err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		cache.DefaultWatchErrorHandler(ctx, r, err)
		if ctx.Err() == nil {
			d.setAPIDown(true, err)
		}
	})
	if err != nil {
		return err
	}
	go d.probeAPI(ctx)
	return nil
}

// probeAPI asks the API server's /readyz until ctx ends.
func (d *Daemon) probeAPI(ctx context.Context) {
	for {
		wait := apiProbeInterval
		if d.apiDown.Load() {
			wait = time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-d.Clock.After(wait):
		}
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := d.Kube.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		d.setAPIDown(err != nil, err)
	}
}

// setAPIDown records whether the API server answers, logging each change.
func (d *Daemon) setAPIDown(down bool, err error) {
	if d.apiDown.Swap(down) == down {
		return
	}
	if down {
		d.Log.Warn("the API server is unreachable; not ready until it answers", "err", err)
	} else {
		d.Log.Info("the API server answers again")
	}
}
