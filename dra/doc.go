// Package dra reads the Dynamic Resource Allocation side of a node: the
// ResourceSlices NVIDIA's DRA driver publishes (the devices it announces,
// their uuid attributes, whether it runs in DynamicMIG mode, where it
// creates MIG devices itself) and the ResourceClaims allocated from them,
// on every served version of resource.k8s.io (v1, else v1beta2, else
// v1beta1), each version converted once into the package's own types.
//
// It may import client-go (through internal/kclient) and the resource.k8s.io
// API types; nothing of the agent.
package dra
