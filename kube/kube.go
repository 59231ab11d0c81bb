package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"reflect"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/migagent/mig-agent/gpus"
	"github.com/migagent/mig-agent/internal/apierr"
	"github.com/migagent/mig-agent/internal/configmap"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/internal/kevent"
	"github.com/migagent/mig-agent/reconcile"
	"github.com/migagent/mig-agent/record"
)

// Cluster is the reconcile.Cluster over client-go: the agent's view of its own Node and
// namespace.
type Cluster struct {
	Client    kclient.Interface
	Node      string
	Namespace string
	Clock     clock.Clock
	// Component is the Event source.
	Component string
	// DefaultConfig is the config of a Node with no desired-config label
	// (--default-config; empty: none).
	DefaultConfig string
	// StartupTaints are removed from the Node once its geometry has
	// converged (--startup-taint; Lift).
	StartupTaints []corev1.Taint
	// Log receives the record lines (the agent's own trail) and what the
	// requester stamp told; nil: discarded.
	Log *slog.Logger

	// seen is the request last seen, and when (requester.go).
	seen requestSeen
	// removals counts the removals of the desired label the watch saw
	// (reconcile.Request.Seq).
	removals atomic.Uint64
	// watched is the Node watch's informer once Watch started it.
	watched atomic.Pointer[cache.SharedIndexInformer]
	// published is the Publication key last written to the ConfigMap.
	published atomic.Pointer[string]
}

var _ reconcile.Cluster = (*Cluster)(nil)

// desired is the Node's label, else the default config.
func (k *Cluster) desired(node *corev1.Node) reconcile.Request {
	seq := k.removals.Load()
	if v, ok := node.Labels[record.LabelConfig]; ok {
		r := k.requester(node, v)
		return reconcile.Request{Config: v, By: r.By, Via: r.Via, Source: r.Source, At: r.At, Asked: true, Seq: seq}
	}
	if k.DefaultConfig != "" {
		return reconcile.Request{Config: k.DefaultConfig, By: record.RequesterDefaultConfig, Source: record.RequesterSourceDefaultConfig, Asked: true, Seq: seq}
	}
	return reconcile.Request{Seq: seq}
}

// Watch implements reconcile.Cluster with an informer on the one Node.
func (k *Cluster) Watch(ctx context.Context, h reconcile.WatchHandlers) (*reconcile.NodeWatch, error) {
	inf := kclient.Watch(k.Client, &corev1.Node{}, k.Client.CoreV1().Nodes(), kclient.ByName(k.Node))
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { h.Changed() },
		// The Node is gone: a change still draining stops where it safely
		// can; the journal keeps it for the Node created again (nodeuid.go).
		DeleteFunc: func(any) { h.Stale() },
		UpdateFunc: func(oldObj, newObj any) {
			o, n := oldObj.(*corev1.Node), newObj.(*corev1.Node)
			_, had := o.Labels[record.LabelConfig]
			if _, has := n.Labels[record.LabelConfig]; had && !has {
				k.removals.Add(1)
			}
			if o.Labels[record.LabelConfig] != n.Labels[record.LabelConfig] {
				// Never keep acting on a stale value: a change still
				// draining for the old one stops.
				h.Stale()
			}
			if o.Labels[record.LabelConfig] != n.Labels[record.LabelConfig] || o.Labels[record.LabelStrategy] != n.Labels[record.LabelStrategy] {
				h.Changed()
			}
		},
	})
	if err != nil {
		return nil, err
	}
	// The reflector retries a failed list or watch quietly: the handler
	// hears of each failure (apihealth.go).
	err = inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		cache.DefaultWatchErrorHandler(ctx, r, err)
		if ctx.Err() == nil {
			h.Error(err)
		}
	})
	if err != nil {
		return nil, err
	}
	// Stop must end the informer before Shutdown waits for it, or the
	// process never exits.
	k.watched.Store(&inf)
	ctx, cancel := context.WithCancel(ctx)
	done := kclient.Start(ctx, inf)
	return &reconcile.NodeWatch{
		Node: func() (*reconcile.Node, bool) {
			obj, ok, err := inf.GetStore().GetByKey(k.Node)
			if err != nil || !ok {
				return nil, false
			}
			return k.snapshot(obj.(*corev1.Node)), true
		},
		Sync: func(ctx context.Context) bool { return kclient.Synced(ctx, inf) },
		Stop: func() {
			cancel()
			<-done
		},
	}, nil
}

// Probe implements Cluster: the API server's /readyz.
func (k *Cluster) Probe(ctx context.Context) error {
	_, err := k.Client.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	return err
}

// Reachable reports whether the API server accepts a TCP connection (no
// request is sent): the probe of an agent whose API server answers.
func (k *Cluster) Reachable(ctx context.Context) error {
	rc := k.Client.CoreV1().RESTClient()
	if rc == nil || reflect.ValueOf(rc).IsNil() {
		return nil // a fake client: nothing to reach
	}
	u := rc.Get().URL()
	addr := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		addr = net.JoinHostPort(u.Hostname(), port)
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("connecting to the API server at %s: %w", addr, err)
	}
	return conn.Close()
}

func (k *Cluster) getNode(ctx context.Context) (*corev1.Node, error) {
	return k.Client.CoreV1().Nodes().Get(ctx, k.Node, metav1.GetOptions{})
}

// CachedNode is the Node as the watch holds it once synced (the event that
// started the pass is in it), else as read from the API server. The cached
// object is shared: callers only read it. For reads that need no
// resourceVersion to write against (an update reads the Node afresh).
func (k *Cluster) CachedNode(ctx context.Context) (*corev1.Node, error) {
	if p := k.watched.Load(); p != nil && (*p).HasSynced() {
		if obj, ok, err := (*p).GetStore().GetByKey(k.Node); err == nil && ok {
			return obj.(*corev1.Node), nil
		}
	}
	return k.getNode(ctx)
}

// Desired implements reconcile.Cluster: the request the snapshot holds.
func (k *Cluster) Desired(node *reconcile.Node) reconcile.Request { return node.Request }

// snapshot is what the core knows of the Node: the request, the MIG
// strategy, the state and the records, decoded once here.
func (k *Cluster) snapshot(n *corev1.Node) *reconcile.Node {
	return &reconcile.Node{Name: n.Name, UID: string(n.UID), Request: k.desired(n),
		Strategy: n.Labels[record.LabelStrategy], State: n.Labels[record.LabelState],
		History: record.Trail(n.Annotations)}
}

// Transient implements reconcile.API.
func (k *Cluster) Transient(err error) bool { return apierr.Transient(err) }

// API implements reconcile.Cluster: the API server's health (Probe,
// Reachable, Transient).
func (k *Cluster) API() reconcile.API { return k }

// SetState sets the state label and, in the same write, the condition
// MIGConfigReady (patchState); "" removes the label.
func (k *Cluster) SetState(ctx context.Context, state string) error {
	var v any = state
	if state == "" {
		v = nil // a patch's null removes the key
	}
	return k.patchState(ctx, nil, map[string]any{"labels": map[string]any{record.LabelState: v}}, state, nil)
}

// patchNode merge-patches the Node as the agent (field manager mig-agent).
func (k *Cluster) patchNode(ctx context.Context, patch map[string]any) error {
	data, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	_, err = k.Client.CoreV1().Nodes().Patch(ctx, k.Node, types.MergePatchType, data, metav1.PatchOptions{FieldManager: "mig-agent"})
	if err != nil {
		return fmt.Errorf("patching node %s: %w", k.Node, err)
	}
	return nil
}

// Event posts an Event on the Node; failures are returned for logging only.
func (k *Cluster) Event(ctx context.Context, node *reconcile.Node, eventType, reason, msg string) error {
	uid := ""
	if node != nil {
		uid = node.UID
	}
	return k.event(ctx, uid, eventType, reason, msg)
}

func (k *Cluster) event(ctx context.Context, uid, eventType, reason, msg string) error {
	return k.poster().Post(ctx, k.Clock.Now(), kevent.NodeRef(k.Node, uid), eventType, reason, msg, false)
}

// poster posts the agent's Events, as component k.Component on its node.
func (k *Cluster) poster() kevent.Poster {
	return kevent.Poster{Client: k.Client, Component: k.Component, Host: k.Node,
		Controller: "migagent.io/mig-agent", Instance: k.Component + "-" + k.Node}
}

// PublishConfigs creates or updates the ConfigMap <node>-mig-config with
// what the agent publishes of n (gpus.Inventory.Publication): the generated
// configs (key config.yaml) and the GPUs as discovered (annotation
// migagent.io/gpus), owned by the Node; nothing when neither changed since
// its last write.
func (k *Cluster) PublishConfigs(ctx context.Context, n *gpus.Inventory) error {
	configYAML, gpusJSON, key, err := n.Publication(k.Clock.Now())
	if err != nil {
		return err
	}
	if p := k.published.Load(); p != nil && *p == key {
		return nil
	}
	if err := k.publish(ctx, configYAML, gpusJSON); err != nil {
		return err
	}
	k.published.Store(&key)
	return nil
}

func (k *Cluster) publish(ctx context.Context, configYAML, gpusJSON string) error {
	node, err := k.CachedNode(ctx)
	if err != nil {
		return err
	}
	name := record.ConfigsConfigMapName(k.Node)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: k.Namespace,
			Labels: map[string]string{record.LabelManagedBy: "mig-agent", record.LabelNode: k.Node},
		},
		Data: map[string]string{record.ConfigMapKey: configYAML},
	}
	cm.Annotations = map[string]string{record.AnnotationGPUs: gpusJSON}
	if node != nil {
		cm.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}
	}
	_, err = configmap.Save(ctx, k.Client.CoreV1().ConfigMaps(k.Namespace), name, nil, func(old *corev1.ConfigMap) (*corev1.ConfigMap, error) {
		if old == nil {
			return cm, nil
		}
		if maps.Equal(old.Data, cm.Data) && old.Annotations[record.AnnotationGPUs] == gpusJSON &&
			len(old.OwnerReferences) == len(cm.OwnerReferences) && old.Labels[record.LabelNode] == k.Node {
			return nil, nil
		}
		if old.Annotations == nil {
			old.Annotations = map[string]string{}
		}
		old.Annotations[record.AnnotationGPUs] = gpusJSON
		old.Data, old.Labels, old.OwnerReferences = cm.Data, cm.Labels, cm.OwnerReferences
		return old, nil
	})
	return err
}
