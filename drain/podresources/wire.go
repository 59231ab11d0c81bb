package podresources

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// The PodResources v1 messages the agent reads, decoded field by field from
// the protobuf wire format. Field numbers are those of k8s.io/kubelet
// pkg/apis/podresources/v1/api.proto; fields the agent does not use (CPU
// ids, memory, topology) and unknown fields are skipped, as protobuf
// requires of a reader.

// Field numbers of the messages read.
const (
	fieldListPodResources = 1 // ListPodResourcesResponse.pod_resources

	fieldPodName       = 1 // PodResources.name
	fieldPodNamespace  = 2 // PodResources.namespace
	fieldPodContainers = 3 // PodResources.containers

	fieldContainerName    = 1 // ContainerResources.name
	fieldContainerDevices = 2 // ContainerResources.devices
	fieldContainerDynamic = 5 // ContainerResources.dynamic_resources

	fieldDevicesResource = 1 // ContainerDevices.resource_name
	fieldDevicesIDs      = 2 // ContainerDevices.device_ids

	fieldDynamicClaimName      = 2 // DynamicResource.claim_name (1, class_name, was removed)
	fieldDynamicClaimNamespace = 3 // DynamicResource.claim_namespace
	fieldDynamicClaimResources = 4 // DynamicResource.claim_resources

	fieldClaimCDIDevices = 1 // ClaimResource.cdi_devices
	fieldClaimDriver     = 2 // ClaimResource.driver_name
	fieldClaimPool       = 3 // ClaimResource.pool_name
	fieldClaimDevice     = 4 // ClaimResource.device_name
	fieldClaimShareID    = 5 // ClaimResource.share_id

	fieldCDIDeviceName = 1 // CDIDevice.name
)

// decodeListPodResources decodes a ListPodResourcesResponse.
func decodeListPodResources(b []byte) ([]Pod, error) {
	var out []Pod
	err := eachField(b, func(num protowire.Number, v []byte) error {
		if num != fieldListPodResources {
			return nil
		}
		p, err := decodePodResources(v)
		out = append(out, p)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("decoding ListPodResourcesResponse: %w", err)
	}
	return out, nil
}

func decodePodResources(b []byte) (Pod, error) {
	var p Pod
	err := eachField(b, func(num protowire.Number, v []byte) error {
		switch num {
		case fieldPodName:
			p.Name = string(v)
		case fieldPodNamespace:
			p.Namespace = string(v)
		case fieldPodContainers:
			c, err := decodeContainer(v)
			p.Containers = append(p.Containers, c)
			return err
		}
		return nil
	})
	return p, err
}

func decodeContainer(b []byte) (Container, error) {
	c := Container{Devices: map[string][]string{}}
	err := eachField(b, func(num protowire.Number, v []byte) error {
		switch num {
		case fieldContainerName:
			c.Name = string(v)
		case fieldContainerDevices:
			res, ids, err := decodeDevices(v)
			c.Devices[res] = append(c.Devices[res], ids...)
			return err
		case fieldContainerDynamic:
			d, err := decodeDynamic(v)
			c.Dynamic = append(c.Dynamic, d)
			return err
		}
		return nil
	})
	c.Claims = claimDevicesOf(c.Dynamic)
	return c, err
}

func decodeDevices(b []byte) (resource string, ids []string, err error) {
	err = eachField(b, func(num protowire.Number, v []byte) error {
		switch num {
		case fieldDevicesResource:
			resource = string(v)
		case fieldDevicesIDs:
			ids = append(ids, string(v))
		}
		return nil
	})
	return resource, ids, err
}

func decodeDynamic(b []byte) (DynamicResource, error) {
	var d DynamicResource
	err := eachField(b, func(num protowire.Number, v []byte) error {
		switch num {
		case fieldDynamicClaimName:
			d.ClaimName = string(v)
		case fieldDynamicClaimNamespace:
			d.ClaimNamespace = string(v)
		case fieldDynamicClaimResources:
			c, err := decodeClaimResource(v)
			d.Claims = append(d.Claims, c)
			return err
		}
		return nil
	})
	return d, err
}

func decodeClaimResource(b []byte) (ClaimResource, error) {
	var c ClaimResource
	err := eachField(b, func(num protowire.Number, v []byte) error {
		switch num {
		case fieldClaimCDIDevices:
			name, err := decodeCDIDevice(v)
			c.CDIDevices = append(c.CDIDevices, name)
			return err
		case fieldClaimDriver:
			c.Driver = string(v)
		case fieldClaimPool:
			c.Pool = string(v)
		case fieldClaimDevice:
			c.Device = string(v)
		case fieldClaimShareID:
			c.ShareID = string(v)
		}
		return nil
	})
	return c, err
}

func decodeCDIDevice(b []byte) (string, error) {
	var name string
	err := eachField(b, func(num protowire.Number, v []byte) error {
		if num == fieldCDIDeviceName {
			name = string(v)
		}
		return nil
	})
	return name, err
}

// eachField calls f with each length-delimited field of message b (strings,
// bytes, messages and packed numbers: every field the agent reads is one)
// and skips fields of the other wire types.
func eachField(b []byte, f func(num protowire.Number, v []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.BytesType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
		if err := f(num, v); err != nil {
			return fmt.Errorf("field %d: %w", num, err)
		}
	}
	return nil
}
