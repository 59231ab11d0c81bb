package dra

import (
	"reflect"
	"testing"
)

func TestPartitionableAndAnnounced(t *testing.T) {
	s := []Slice{
		{Name: "a", Driver: NVIDIADRADriver, Pool: "n1", Devices: []SliceDevice{
			{Name: "gpu-1", Type: "gpu", UUID: "GPU-1"}, {Name: "gpu-0-mig-1g18gb-19-0", Type: "mig", UUID: "MIG-a"},
			{Name: "gpu-vfio-2", Type: "vfio", UUID: "GPU-2"}}},
		{Name: "b", Driver: "example.com/gpu", CounterSets: 1, Devices: []SliceDevice{{Name: "x", Type: "mig", UUID: "MIG-x"}}},
	}
	if got := Partitionable(s); got != "" {
		t.Fatalf("Partitionable = %q for pre-created devices", got)
	}
	if got := AnnouncedUUIDs(s); !reflect.DeepEqual(got, []string{"GPU-1", "MIG-a"}) {
		t.Fatalf("AnnouncedUUIDs = %v", got)
	}
	s[0].Devices[1].ConsumesCounters = true
	if got := Partitionable(s); got == "" {
		t.Fatal("Partitionable missed a device consuming counters")
	}
}
