// Package standalone is the Cluster of a daemon without Kubernetes
// (mig-agent run --standalone): the desired config is --selected-config,
// records go to the log, and there is no Node, no Event, no ConfigMap and
// no API server. It may import reconcile (the interface it implements) and
// record.
package standalone

import (
	"context"
	"log/slog"

	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/reconcile"
	"github.com/migagent/mig-agent/record"
)

// Standalone is the Cluster of a daemon without Kubernetes: the desired
// config is --selected-config, records go to the log, and there is no
// Node, no Event, no ConfigMap and no API server.
type Standalone struct {
	Config string // --selected-config
	Log    *slog.Logger
}

var _ reconcile.Cluster = (*Standalone)(nil)

// Watch implements Cluster: nothing to watch.
func (s *Standalone) Watch(context.Context, reconcile.WatchHandlers) (*reconcile.NodeWatch, error) {
	return &reconcile.NodeWatch{Node: func() (*reconcile.Node, bool) { return nil, true }, Stop: func() {}}, nil
}

// Desired implements Cluster: the selected config.
func (s *Standalone) Desired(*reconcile.Node) reconcile.Request {
	return reconcile.Request{Config: s.Config, By: record.RequesterStandalone, Source: record.RequesterSourceStandalone, Asked: s.Config != ""}
}

// SetState implements Cluster: the state is in the metrics only.
func (s *Standalone) SetState(context.Context, string) error { return nil }

// Record implements Cluster: the record goes to the log.
func (s *Standalone) Record(_ context.Context, rec record.ChangeRecord, _ string) error {
	s.Log.Info("change record", "config", rec.Config, "result", rec.Result, "reason", rec.Reason,
		"gpusChanged", rec.GPUsChanged, "reboot", rec.Reboot, "configHash", rec.ConfigHash)
	return nil
}

// Event implements Cluster: no Events without an API server.
func (s *Standalone) Event(context.Context, *reconcile.Node, string, string, string) error {
	return nil
}

// PublishConfigs implements Cluster: no ConfigMap.
func (s *Standalone) PublishConfigs(context.Context, *gpus.Inventory) error { return nil }

// Preflight implements Cluster: nothing to record on.
func (s *Standalone) Preflight(context.Context, bool) error { return nil }

// Probe implements reconcile.API: no API server to be away.
func (s *Standalone) Probe(context.Context) error { return nil }

// Reachable implements reconcile.API: no API server to be away.
func (s *Standalone) Reachable(context.Context) error { return nil }

// Transient implements reconcile.API: nothing to retry.
func (s *Standalone) Transient(error) bool { return false }

// API implements Cluster: no API server, always healthy.
func (s *Standalone) API() reconcile.API { return s }
