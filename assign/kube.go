package assign

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/migagent/mig-agent/internal/configmap"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/internal/kevent"
	"github.com/migagent/mig-agent/record"
)

// EventReason is the reason of the Event on a pod that got a MIG device.
const EventReason = "MigDeviceAssigned"

// ConfigMapSuffix names the history's ConfigMap: <node>-mig-assignments,
// in the agent's namespace.
const ConfigMapSuffix = "-mig-assignments"

// ErrNoHistory: the node has no assignment history (yet).
var ErrNoHistory = errors.New("no assignment history")

// ConfigMapName is the name of node's history ConfigMap.
func ConfigMapName(node string) string { return node + ConfigMapSuffix }

// ConfigMapStore keeps the history in the ConfigMap <node>-mig-assignments
// of the agent's namespace: off the Node (a Node carries what schedulers
// and kubelets read on every update; an audit trail of every pod would
// weigh on all of them), owned by nobody (it outlives the Node's pods and
// the Node itself), and written only by this node's agent (the admission
// policy mig-agent-assignments-scope).
type ConfigMapStore struct {
	Client    kclient.Interface
	Namespace string
	Node      string

	cm *corev1.ConfigMap // as last read or written
}

var _ Store = (*ConfigMapStore)(nil)

// Load implements Store: the history, empty where the ConfigMap does not
// exist yet. A ConfigMap whose history does not decode is an error: it is
// not overwritten.
func (s *ConfigMapStore) Load(ctx context.Context) (*History, error) {
	cm, err := s.Client.CoreV1().ConfigMaps(s.Namespace).Get(ctx, ConfigMapName(s.Node), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		s.cm = nil
		return &History{Node: s.Node}, nil
	case err != nil:
		return nil, err
	}
	h, err := Decode([]byte(cm.Data[HistoryKey]))
	if err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s: %w", s.Namespace, cm.Name, err)
	}
	h.Node = s.Node
	s.cm = cm
	return h, nil
}

// Save implements Store: one Create or Update of the ConfigMap as Load
// read it or Save last wrote it, under configmap.Save's rule for a
// conflict (read it again, write anew).
func (s *ConfigMapStore) Save(ctx context.Context, h *History) error {
	data, err := h.Encode()
	if err != nil {
		return err
	}
	cm, err := configmap.Save(ctx, s.Client.CoreV1().ConfigMaps(s.Namespace), ConfigMapName(s.Node), s.cm, func(cm *corev1.ConfigMap) (*corev1.ConfigMap, error) {
		if cm == nil {
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName(s.Node), Namespace: s.Namespace,
				Labels: map[string]string{record.LabelManagedBy: "mig-agent", record.LabelNode: s.Node}}}
		}
		cm.Data = map[string]string{HistoryKey: string(data)}
		return cm, nil
	})
	if err != nil {
		return err
	}
	s.cm = cm
	return nil
}

// ReadConfigMap reads node's history from its ConfigMap in namespace
// (`mig-agent assignments`, `mig-agent status`); ErrNoHistory where there is
// none.
func ReadConfigMap(ctx context.Context, client kclient.Interface, namespace, node string) (*History, error) {
	cm, err := client.CoreV1().ConfigMaps(namespace).Get(ctx, ConfigMapName(node), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w for node %s in namespace %s (ConfigMap %s)", ErrNoHistory, node, namespace, ConfigMapName(node))
	}
	if err != nil {
		return nil, err
	}
	h, err := Decode([]byte(cm.Data[HistoryKey]))
	if err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s: %w", namespace, cm.Name, err)
	}
	return h, nil
}

// KubePods reads a pod's UID and posts the MigDeviceAssigned Event on it.
type KubePods struct {
	Client kclient.Interface
	Node   string
	Clock  clock.Clock
}

var _ Pods = (*KubePods)(nil)

// UID implements Pods.
func (k *KubePods) UID(ctx context.Context, namespace, name string) (string, error) {
	p, err := k.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	return string(p.UID), nil
}

// Assigned implements Pods: a Normal Event MigDeviceAssigned on the pod,
// naming the device UUID, profile, GPU index and node. A pod whose UID is
// unknown (it could not be read) gets none.
func (k *KubePods) Assigned(ctx context.Context, e Entry) error {
	if e.PodUID == "" {
		return nil
	}
	ref := kevent.PodRef(e.Namespace, e.Pod, e.PodUID)
	ref.FieldPath = fmt.Sprintf("spec.containers{%s}", e.Container)
	p := kevent.Poster{Client: k.Client, Component: "mig-agent", Host: k.Node,
		Controller: "migagent.io/mig-agent", Instance: "mig-agent-" + k.Node}
	return p.Post(ctx, k.Clock.Now(), ref, corev1.EventTypeNormal, EventReason, eventMessage(e, k.Node), false)
}

// eventMessage is the Event's text: the device UUID, profile, GPU index,
// placement and node.
func eventMessage(e Entry, node string) string {
	d := e.Device
	if d.GPU < 0 {
		return fmt.Sprintf("container %s got MIG device %s on node %s", e.Container, d.UUID, node)
	}
	return fmt.Sprintf("container %s got MIG device %s (profile %s, GPU %d, placement %s) on node %s",
		e.Container, d.UUID, d.Profile, d.GPU, d.Placement, node)
}

// NodeRecords returns the change records of the Node read returns, newest
// first (nil where it cannot be read).
func NodeRecords(read func(context.Context) (*corev1.Node, error)) func(context.Context) []record.ChangeRecord {
	return func(ctx context.Context) []record.ChangeRecord {
		n, err := read(ctx)
		if err != nil || n == nil {
			return nil
		}
		return record.Trail(n.Annotations)
	}
}
