package podresources

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/migagent/mig-agent/dra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// listResponse is a ListPodResourcesResponse with every field set, the DRA
// ones and those the agent skips (CPU ids, memory, topology) included.
func listResponse() *podresourcesv1.ListPodResourcesResponse {
	share := "share-1"
	topo := &podresourcesv1.TopologyInfo{Nodes: []*podresourcesv1.NUMANode{{ID: 1}}}
	return &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{{
		Name: "train", Namespace: "ml", CpuIds: []int64{2, 3},
		Containers: []*podresourcesv1.ContainerResources{{
			Name: "main", CpuIds: []int64{4, 5, 600},
			Devices: []*podresourcesv1.ContainerDevices{
				{ResourceName: "nvidia.com/mig-1g.18gb", DeviceIds: []string{"MIG-a", "MIG-b"}, Topology: topo},
				{ResourceName: "nvidia.com/mig-1g.18gb", DeviceIds: []string{"MIG-c"}},
			},
			Memory: []*podresourcesv1.ContainerMemory{{MemoryType: "memory", Size: 1 << 30, Topology: topo}},
			DynamicResources: []*podresourcesv1.DynamicResource{{
				ClaimName: "gpu", ClaimNamespace: "ml",
				ClaimResources: []*podresourcesv1.ClaimResource{{
					CdiDevices: []*podresourcesv1.CDIDevice{{Name: "k8s.gpu.nvidia.com/device=mig-0"}},
					DriverName: "gpu.nvidia.com", PoolName: "node-1", DeviceName: "gpu-0-mig-1g", ShareId: &share,
				}},
			}},
		}, {Name: "sidecar"}},
	}, {Name: "idle", Namespace: "ml"}}}
}

// TestDecodeListPodResources decodes what the kubelet's own generated code
// encodes.
func TestDecodeListPodResources(t *testing.T) {
	b, err := proto.Marshal(listResponse())
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeListPodResources(b)
	if err != nil {
		t.Fatal(err)
	}
	want := []Pod{{Namespace: "ml", Name: "train", Containers: []Container{{
		Name:    "main",
		Devices: map[string][]string{"nvidia.com/mig-1g.18gb": {"MIG-a", "MIG-b", "MIG-c"}},
		Dynamic: []DynamicResource{{ClaimName: "gpu", ClaimNamespace: "ml", Claims: []ClaimResource{{
			CDIDevices: []string{"k8s.gpu.nvidia.com/device=mig-0"},
			Driver:     "gpu.nvidia.com", Pool: "node-1", Device: "gpu-0-mig-1g", ShareID: "share-1"}}}},
		Claims: []dra.ClaimDevice{{Driver: "gpu.nvidia.com", Pool: "node-1", Device: "gpu-0-mig-1g"}},
	}, {Name: "sidecar", Devices: map[string][]string{}}}}, {Namespace: "ml", Name: "idle"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
	}
}

func TestDecodeListPodResourcesRejectsTruncated(t *testing.T) {
	b, err := proto.Marshal(listResponse())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, len(b) / 2, len(b) - 1} {
		if _, err := decodeListPodResources(b[:n]); err == nil {
			t.Errorf("%d of %d bytes decoded without error", n, len(b))
		}
	}
}

// lister is a grpc-go PodResources server answering List with resp or err.
type lister struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	resp *podresourcesv1.ListPodResourcesResponse
	err  error
}

func (l *lister) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	return l.resp, l.err
}

// serve runs l on a unix socket with grpc-go's server, the one the kubelet
// runs, and returns the socket path.
func serve(t *testing.T, l *lister) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, l)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return socket
}

func TestListPodResourcesOverGRPCServer(t *testing.T) {
	socket := serve(t, &lister{resp: listResponse()})
	got, err := List(context.Background(), socket)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Key() != "ml/idle" || got[1].Key() != "ml/train" {
		t.Fatalf("pods %+v", got)
	}
	if ids := got[1].GPUDeviceIDs(); !reflect.DeepEqual(ids, []string{"MIG-a", "MIG-b", "MIG-c"}) {
		t.Fatalf("GPU devices %v", ids)
	}
}

func TestListPodResourcesStatusError(t *testing.T) {
	socket := serve(t, &lister{err: status.Error(codes.PermissionDenied, "not allowed: 100%")})
	_, err := List(context.Background(), socket)
	if !errors.Is(err, ErrUnreadable) || !errors.Is(err, errGRPCStatus) {
		t.Fatalf("err %v, want ErrPodResources and a gRPC status", err)
	}
	if !strings.Contains(err.Error(), "PermissionDenied") || !strings.Contains(err.Error(), "not allowed: 100%") {
		t.Fatalf("err %v does not carry the code and message", err)
	}
}

func TestListPodResourcesNoServer(t *testing.T) {
	_, err := List(context.Background(), filepath.Join(t.TempDir(), "none.sock"))
	if !errors.Is(err, ErrUnreadable) {
		t.Fatalf("err %v, want ErrPodResources", err)
	}
}
