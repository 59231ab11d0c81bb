package reconcile

import (
	"context"
	"time"

	"github.com/migagent/mig-agent/internal/backoff"
)

// probeAPI asks the API server's /readyz until ctx ends. The API server
// counts as unreachable (/readyz of the agent false) on two signs: the Node
// watch reporting a failed list or watch (WatchHandlers.Error), and this
// probe, needed because the reflector retries a refused watch connection
// quietly, reporting nothing, so a watch can be dead for minutes without a
// word.
//
// While the server answers, the probe is Cluster.Reachable
// (a TCP connect: a refused connection is exactly the case the reflector
// keeps quiet about, and a connect is no request, so an idle fleet sends the
// API server nothing); once it is down, Probe (its /readyz) every second
// until it says ok.
func (d *Daemon) probeAPI(ctx context.Context) {
	for {
		down := d.apiDown.Load()
		select {
		case <-ctx.Done():
			return
		case <-d.Clock.After(backoff.APIProbe(down)):
		}
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		var err error
		if !down {
			err = d.Cluster.Reachable(pctx)
		} else {
			err = d.Cluster.Probe(pctx)
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		if down || err != nil {
			d.setAPIDown(err != nil, err)
		}
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
