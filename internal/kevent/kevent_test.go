package kevent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/migagent/mig-agent/testkit/clientset"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// A pod's Event lands in its namespace, a Node's in the default one; the
// name is the API server's to make from the object's, the message is cut
// at MaxMessage and the source and reporter are the Poster's.
func TestPost(t *testing.T) {
	c := fake.NewClientset()
	p := Poster{Client: clientset.Wrap(c), Component: "mig-agent", Host: "n1", Controller: "migagent.io/mig-agent", Instance: "mig-agent-n1"}
	ctx, now := context.Background(), time.Unix(100, 0)
	if err := p.Post(ctx, now, PodRef("ml", "p", "u-1"), corev1.EventTypeNormal, "R", strings.Repeat("x", 2000), false); err != nil {
		t.Fatal(err)
	}
	if err := p.Post(ctx, now, NodeRef("n1", "u-n"), corev1.EventTypeWarning, "W", "m", false); err != nil {
		t.Fatal(err)
	}
	pods, _ := c.CoreV1().Events("ml").List(ctx, metav1.ListOptions{})
	nodes, _ := c.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	if len(pods.Items) != 1 || len(nodes.Items) != 1 {
		t.Fatalf("Events: %d in ml, %d in default", len(pods.Items), len(nodes.Items))
	}
	ev := pods.Items[0]
	if ev.GenerateName != "p." || len(ev.Message) > MaxMessage || ev.InvolvedObject.UID != "u-1" || ev.Count != 1 ||
		ev.Source.Component != "mig-agent" || ev.Source.Host != "n1" || ev.ReportingInstance != "mig-agent-n1" || !ev.FirstTimestamp.Time.Equal(now) {
		t.Errorf("pod Event %+v", ev)
	}
	if ev := nodes.Items[0]; ev.InvolvedObject.Kind != "Node" || ev.Reason != "W" || ev.Type != corev1.EventTypeWarning {
		t.Errorf("node Event %+v", ev)
	}
}
