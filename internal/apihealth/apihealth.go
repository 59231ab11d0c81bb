// Package apihealth tells whether the API server answers, for the agent's
// readiness: the Node watch's failures and a probe of its own.
package apihealth

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/migagent/mig-agent/internal/backoff"
)

// Health is whether the API server answers. It counts as unreachable on
// two signs: the Node watch reporting a failed list or watch (Set), and
// Run's probe, needed because the reflector retries a refused watch
// connection quietly, reporting nothing, so a watch can be dead for
// minutes without a word.
//
// While the server answers, the probe is Reachable (a TCP connect: a
// refused connection is exactly the case the reflector keeps quiet about,
// and a connect is no request, so an idle fleet sends the API server
// nothing); once it is down, Probe (its /readyz) every second until it
// says ok.
type Health struct {
	Reachable, Probe func(context.Context) error
	Clock            clock.Clock
	Log              *slog.Logger

	down atomic.Bool
}

// Down reports whether the API server is taken as unreachable now.
func (h *Health) Down() bool { return h.down.Load() }

// Run probes until ctx ends.
func (h *Health) Run(ctx context.Context) {
	for {
		down := h.down.Load()
		select {
		case <-ctx.Done():
			return
		case <-h.Clock.After(backoff.APIProbe(down)):
		}
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		var err error
		if !down {
			err = h.Reachable(pctx)
		} else {
			err = h.Probe(pctx)
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		if down || err != nil {
			h.Set(err != nil, err)
		}
	}
}

// Set records whether the API server answers, logging each change.
func (h *Health) Set(down bool, err error) {
	if h.down.Swap(down) == down {
		return
	}
	if down {
		h.Log.Warn("the API server is unreachable; not ready until it answers", "err", err)
	} else {
		h.Log.Info("the API server answers again")
	}
}
