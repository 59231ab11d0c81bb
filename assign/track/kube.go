package track

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/migagent/mig-agent/assign"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/internal/kevent"
	"github.com/migagent/mig-agent/record"
)

// EventReason is the reason of the Event on a pod that got a MIG device.
const EventReason = "MigDeviceAssigned"

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
func (k *KubePods) Assigned(ctx context.Context, e assign.Entry) error {
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
func eventMessage(e assign.Entry, node string) string {
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
