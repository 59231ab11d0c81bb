package assign

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/internal/configmap"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/record"
)

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
