// Package testplugin is a minimal device plugin of the kubelet's v1beta1
// API, for the real-node tests (testkit/realnode): it serves its socket in
// the kubelet's device-plugin directory, registers at the kubelet's socket,
// advertises its devices healthy, and answers Allocate with the environment
// variable REALNODE_DEVICES (the IDs, comma separated), which the pause
// program prints in the container's log. It checks the real kubelet's
// device manager (registration, allocatable, admission, Allocate); NVIDIA's
// own plugin is what the real node runs for MIG devices. The tests run it
// in their own process (realnode.Node.StartPlugin) and as a DaemonSet pod
// (testkit/realnode/deviceplugin).
package testplugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Plugin serves one resource.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	Resource string
	// Specs are the device nodes Allocate passes to every container (as
	// NVIDIA's plugin does with PASS_DEVICE_SPECS); set before Start.
	Specs   []*pluginapi.DeviceSpec
	devices []string

	mu       sync.Mutex
	allocate [][]string // the device IDs of each Allocate call's containers
}

var _ pluginapi.DevicePluginServer = (*Plugin)(nil)

// New returns a plugin for resource with these device IDs.
func New(resource string, devices ...string) *Plugin {
	return &Plugin{Resource: resource, devices: devices}
}

// Start serves the plugin on a socket of its own in dir (the kubelet's
// pluginapi.DevicePluginPath unless a test says otherwise) and registers
// it at kubeletSocket. stop ends serving and removes the socket.
func (p *Plugin) Start(dir, kubeletSocket string) (stop func(), err error) {
	endpoint := fmt.Sprintf("testplugin-%d-%d.sock", os.Getpid(), time.Now().UnixNano())
	sock := filepath.Join(dir, endpoint)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("device plugin: %w", err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(l) }()
	stop = func() {
		srv.Stop()
		_ = os.Remove(sock)
	}
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		stop()
		return nil, fmt.Errorf("device plugin: %w", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: p.Resource,
	}); err != nil {
		stop()
		return nil, fmt.Errorf("device plugin: register %s at %s: %w", p.Resource, kubeletSocket, err)
	}
	return stop, nil
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
			Envs:    map[string]string{"REALNODE_DEVICES": strings.Join(c.DevicesIds, ",")},
			Devices: p.Specs,
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
