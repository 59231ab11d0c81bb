// Package published reads what the agents publish about their nodes, for
// the clients that are not an agent (the planner): on the Node, the
// desired config, who asked for it (RequesterOf), the state and the change
// records; in the ConfigMap <node>-mig-history, the change records whole
// (ReadHistory); in the ConfigMap <node>-mig-config, the GPUs as the agent
// discovered them (models, profiles, placements); in the ConfigMap
// <node>-mig-assignments, the assignment trail. It decodes with the agent's
// own codecs (record, geometry, assign) and links neither the agent's core
// nor NVML: a client of the agents needs none of what only an agent does.
// The agent reads through it too what it records (the requester, the
// records its history ConfigMap holds); package published/status is the
// view of a node that `mig-agent status` shows.
package published

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/migagent/mig-agent/assign"
	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/record"
)

// Node is what a node's agent says of it on the Node.
type Node struct {
	// Desired is the label nvidia.com/mig.config; State the label
	// nvidia.com/mig.config.state ("" when unset).
	Desired, State string
	// Applied is the config of the newest record with result success
	// (record.Applied); "" when none.
	Applied string
	// Geometry is the per-GPU geometry of the newest record that has one
	// (record.WithGeometry), finished at GeometryAt; nil when none has.
	Geometry   []record.GPUGeometry
	GeometryAt *time.Time
}

// NodeOf reads n's labels and change records (record.NodeRecords: the
// last change, then the history); a record that does not decode is
// skipped.
func NodeOf(n *corev1.Node) Node {
	out := Node{Desired: n.Labels[record.LabelConfig], State: n.Labels[record.LabelState]}
	recs := record.NodeRecords(n.Annotations)
	if r := record.Applied(recs); r != nil {
		out.Applied = r.Config
	}
	if i := record.WithGeometry(recs); i >= 0 {
		at := recs[i].FinishedAt
		out.Geometry, _ = record.GeometryRows(recs[i].Geometry)
		out.GeometryAt = &at
	}
	return out
}

// ErrNotPublished: the node's agent has published no GPUs (an agent older
// than the planner, or one that has not read NVML yet).
var ErrNotPublished = fmt.Errorf("its agent has published no GPUs (ConfigMap <node>-mig-config, annotation %s)", record.AnnotationGPUs)

// GPUs reads the GPUs node's agent discovered through NVML and published:
// the ConfigMap record.ConfigsConfigMapName(node) in namespace, annotation
// record.AnnotationGPUs (geometry.ParsePublished). ErrNotPublished where
// there is none.
func GPUs(ctx context.Context, c kclient.Interface, namespace, node string) (*geometry.Published, []geometry.GPU, error) {
	name := record.ConfigsConfigMapName(node)
	cm, err := c.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil, ErrNotPublished
	case err != nil:
		return nil, nil, fmt.Errorf("reading ConfigMap %s/%s: %w", namespace, name, err)
	}
	data, ok := cm.Annotations[record.AnnotationGPUs]
	if !ok {
		return nil, nil, ErrNotPublished
	}
	return geometry.ParsePublished([]byte(data))
}

// Trail reads node's assignment trail (assign.ReadConfigMap); nil, and no
// error, where its agent has written none.
func Trail(ctx context.Context, c kclient.Interface, namespace, node string) (*assign.History, error) {
	h, err := assign.ReadConfigMap(ctx, c, namespace, node)
	if errors.Is(err, assign.ErrNoHistory) {
		return nil, nil
	}
	return h, err
}
