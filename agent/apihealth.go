package agent

import (
	"context"
	"time"
)

// apiProbeInterval is how often the API server's /readyz is asked while it
// answers (while it does not, every second). As often as the kubelet
// renews its node Lease, and cheaper: /readyz touches no object.
const apiProbeInterval = 10 * time.Second

// probeAPI asks the API server's /readyz until ctx ends. The API server
// counts as unreachable (/readyz of the agent false) on two signs: the Node
// watch reporting a failed list or watch (WatchHandlers.Error), and this
// probe, needed because the reflector retries a refused watch connection
// quietly, reporting nothing, so a watch can be dead for minutes without a
// word.
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
		err := d.Cluster.Probe(pctx)
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
