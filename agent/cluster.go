package agent

import (
	"context"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Cluster is the Kubernetes side of the daemon behind one interface: the
// watch of its Node, the desired-config label, the state label and change
// records on the Node, Events, the ConfigMap of generated configs and the
// API server's health. Kube is the implementation over client-go;
// Standalone is the daemon without Kubernetes (mig-agent run --standalone),
// which has no Node. The reconcile core reaches Kubernetes only through a
// Cluster and a Disruptor (the pods, the taint and the operands a change
// disturbs).
type Cluster interface {
	// Watch follows the Node until ctx ends or Stop.
	Watch(ctx context.Context, h WatchHandlers) (*NodeWatch, error)
	// Desired is the config the Node asks for (node: as last seen).
	Desired(node *corev1.Node) Request
	// GetNode reads the Node afresh (Standalone: nil).
	GetNode(ctx context.Context) (*corev1.Node, error)
	// SetState sets the state label (and nothing else).
	SetState(ctx context.Context, state string) error
	// Record writes a change record and the state label together.
	Record(ctx context.Context, node *corev1.Node, rec ChangeRecord, state string) error
	// Event posts an Event on the Node; failures are for logging only.
	Event(ctx context.Context, node *corev1.Node, eventType, reason, msg string) error
	// PublishConfigs writes the generated configs to the node's ConfigMap.
	PublishConfigs(ctx context.Context, node *corev1.Node, configYAML string) error
	// Preflight proves the rights a change needs to record itself.
	Preflight(ctx context.Context, node *corev1.Node, taint bool) error
	// Probe asks the API server whether it is ready.
	Probe(ctx context.Context) error
}

// Request is the desired config and who asked for it.
type Request struct {
	Config string
	By     string
	// Via is the field manager of the write that asked, where known.
	Via string
	At  *time.Time
	// Asked is false when nothing is asked (no label, no default); a label
	// set to "" asks, and fails with a reason.
	Asked bool
}

// WatchHandlers are called by a Cluster's watch of the Node.
type WatchHandlers struct {
	// Changed: the Node appeared, or its desired config or MIG strategy
	// label changed: a pass is due.
	Changed func()
	// Stale: the desired config changed or the Node is gone: the pass in
	// progress acts on a stale value and must stop where it safely can.
	Stale func()
	// Error: the watch could not list or watch the Node.
	Error func(error)
}

// NodeWatch is a running watch of the Node.
type NodeWatch struct {
	// Node is the Node as last seen; seen is false while it has not been
	// seen (Standalone: always seen, and nil).
	Node func() (node *corev1.Node, seen bool)
	// Sync waits until the watch holds the Node's current state; false
	// when ctx ended first. Nil when there is nothing to wait for
	// (Standalone): the daemon is ready once its first pass is done.
	Sync func(ctx context.Context) bool
	// Stop ends the watch and waits for it.
	Stop func()
}

// Standalone is the Cluster of a daemon without Kubernetes: the desired
// config is --selected-config, records go to the log, and there is no
// Node, no Event, no ConfigMap and no API server.
type Standalone struct {
	Config string // --selected-config
	Log    *slog.Logger
}

var _ Cluster = (*Standalone)(nil)

// Watch implements Cluster: nothing to watch.
func (s *Standalone) Watch(context.Context, WatchHandlers) (*NodeWatch, error) {
	return &NodeWatch{Node: func() (*corev1.Node, bool) { return nil, true }, Stop: func() {}}, nil
}

// Desired implements Cluster: the selected config.
func (s *Standalone) Desired(*corev1.Node) Request {
	return Request{Config: s.Config, By: "standalone", Asked: s.Config != ""}
}

// GetNode implements Cluster: there is no Node.
func (s *Standalone) GetNode(context.Context) (*corev1.Node, error) { return nil, nil }

// SetState implements Cluster: the state is in the metrics only.
func (s *Standalone) SetState(context.Context, string) error { return nil }

// Record implements Cluster: the record goes to the log.
func (s *Standalone) Record(_ context.Context, _ *corev1.Node, rec ChangeRecord, _ string) error {
	s.Log.Info("change record", "config", rec.Config, "result", rec.Result, "reason", rec.Reason,
		"gpusChanged", rec.GPUsChanged, "reboot", rec.Reboot, "configHash", rec.ConfigHash)
	return nil
}

// Event implements Cluster: no Events without an API server.
func (s *Standalone) Event(context.Context, *corev1.Node, string, string, string) error { return nil }

// PublishConfigs implements Cluster: no ConfigMap.
func (s *Standalone) PublishConfigs(context.Context, *corev1.Node, string) error { return nil }

// Preflight implements Cluster: nothing to record on.
func (s *Standalone) Preflight(context.Context, *corev1.Node, bool) error { return nil }

// Probe implements Cluster: no API server to be away.
func (s *Standalone) Probe(context.Context) error { return nil }
