package realnode

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Plugin is a minimal device plugin of the kubelet's v1beta1 API: it serves
// its socket in the kubelet's device-plugin directory, registers at the
// kubelet's socket, advertises its devices healthy, and answers Allocate
// with the environment variable REALNODE_DEVICES (the IDs, comma
// separated), which the pause program prints in the container's log. It
// exists to check the real kubelet's device manager (registration,
// allocatable, admission, Allocate); NVIDIA's plugin is what the node's
// tests run.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	Resource string
	devices  []string

	mu       sync.Mutex
	allocate [][]string // the device IDs of each Allocate call's containers
}

var _ pluginapi.DevicePluginServer = (*Plugin)(nil)

// StartPlugin serves resource with devices until the test ends and
// registers it with the node's kubelet.
func (n *Node) StartPlugin(t testing.TB, resource string, devices ...string) *Plugin {
	t.Helper()
	p := &Plugin{Resource: resource, devices: devices}
	endpoint := "realnode-" + randSuffix() + ".sock"
	sock := filepath.Join(pluginapi.DevicePluginPath, endpoint)
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatalf("device plugin: %v", err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Stop()
		_ = os.Remove(sock)
	})
	conn, err := grpc.NewClient("unix://"+pluginapi.KubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("device plugin: %v", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: resource,
	}); err != nil {
		t.Fatalf("device plugin: register %s at %s: %v", resource, pluginapi.KubeletSocket, err)
	}
	return p
}

// GetDevicePluginOptions: no PreStartContainer, no preferred allocation.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the devices once, healthy, and holds the stream.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	resp := &pluginapi.ListAndWatchResponse{}
	for _, d := range p.devices {
		resp.Devices = append(resp.Devices, &pluginapi.Device{ID: d, Health: pluginapi.Healthy})
	}
	if err := s.Send(resp); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// Allocate records the IDs and answers with REALNODE_DEVICES.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range req.ContainerRequests {
		p.allocate = append(p.allocate, c.DevicesIds)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"REALNODE_DEVICES": strings.Join(c.DevicesIds, ",")},
		})
	}
	return resp, nil
}

// Allocated returns the device IDs of every container Allocate was called
// for, in order.
func (p *Plugin) Allocated() [][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([][]string, len(p.allocate))
	copy(out, p.allocate)
	return out
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
