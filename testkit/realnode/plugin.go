package realnode

import (
	"context"
	"fmt"
	"testing"

	"github.com/migagent/mig-agent/testkit/realnode/testplugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// StartPlugin serves resource with devices from the test's process until
// the test ends, registered with the node's kubelet (package testplugin).
func (n *Node) StartPlugin(t testing.TB, resource string, devices ...string) *testplugin.Plugin {
	t.Helper()
	return n.StartPluginWith(t, testplugin.New(resource, devices...))
}

// StartPluginWith serves p (made by testplugin.New, its Specs set) until the
// test ends, registered with the node's kubelet.
func (n *Node) StartPluginWith(t testing.TB, p *testplugin.Plugin) *testplugin.Plugin {
	t.Helper()
	stop, err := p.Start(pluginapi.DevicePluginPath, pluginapi.KubeletSocket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return p
}

// ListPodResources asks the kubelet's own PodResources service (List).
func (n *Node) ListPodResources(ctx context.Context) (*podresourcesv1.ListPodResourcesResponse, error) {
	conn, err := grpc.NewClient("unix://"+n.PodResourcesSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("podresources: %w", err)
	}
	defer conn.Close()
	return podresourcesv1.NewPodResourcesListerClient(conn).List(ctx, &podresourcesv1.ListPodResourcesRequest{})
}
