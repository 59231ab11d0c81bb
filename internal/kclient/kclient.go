// Package kclient is the part of the Kubernetes API the agent calls, and a
// client for it that links only the API groups it names.
//
// client-go's generated clientset (k8s.io/client-go/kubernetes) and every
// typed group package register all of Kubernetes' API types in one scheme
// (k8s.io/client-go/kubernetes/scheme): the agent carried the encoders of
// some fifty group versions it never reads, in its binary and in the memory
// their registration takes. Here the scheme holds core/v1,
// coordination.k8s.io/v1, policy/v1 and resource.k8s.io/v1, and each
// resource is client-go's own generic client (k8s.io/client-go/gentype)
// over a REST client of its group, as the generated clients build them.
//
// The interfaces below are subsets of the generated ones, with the same
// method names and signatures, so the code reads as it would with the
// clientset, and a clientset (a fake one in tests) fits them through
// package testkit/clientset. The client itself is kclient/restclient's:
// what only reads or writes through these interfaces (the planner) links
// none of the generic client's machinery (gentype and what it pulls in:
// server-side apply, structured-merge-diff, OpenAPI, protobuf).
package kclient

import (
	"context"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourcev1 "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// Interface is the agent's client: the API groups it calls.
type Interface interface {
	CoreV1() CoreV1
	CoordinationV1() CoordinationV1
	PolicyV1() PolicyV1
	ResourceV1() ResourceV1
	// ResourceV1beta2 and ResourceV1beta1 are read where the cluster
	// serves DRA only in an older version (Kubernetes 1.32-1.33).
	ResourceV1beta2() ResourceV1beta2
	ResourceV1beta1() ResourceV1beta1
}

// CoreV1 is the core API group, version v1.
type CoreV1 interface {
	// RESTClient is the group's REST client (the API server's /readyz
	// is read through it); a fake clientset's is nil.
	RESTClient() rest.Interface
	Nodes() Nodes
	Pods(namespace string) Pods
	ConfigMaps(namespace string) ConfigMaps
	Events(namespace string) Events
}

// Nodes is the agent's use of the Node resource.
type Nodes interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Node, error)
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.NodeList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Update(ctx context.Context, node *corev1.Node, opts metav1.UpdateOptions) (*corev1.Node, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions,
		subresources ...string) (*corev1.Node, error)
}

// Pods is the agent's use of the Pod resource (evictions: PolicyV1).
type Pods interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Pod, error)
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// ConfigMaps is the agent's use of the ConfigMap resource.
type ConfigMaps interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.ConfigMap, error)
	Create(ctx context.Context, cm *corev1.ConfigMap, opts metav1.CreateOptions) (*corev1.ConfigMap, error)
	Update(ctx context.Context, cm *corev1.ConfigMap, opts metav1.UpdateOptions) (*corev1.ConfigMap, error)
}

// Events is the agent's use of the core Event resource.
type Events interface {
	Create(ctx context.Context, ev *corev1.Event, opts metav1.CreateOptions) (*corev1.Event, error)
}

// CoordinationV1 is coordination.k8s.io/v1.
type CoordinationV1 interface {
	Leases(namespace string) Leases
}

// Leases is the agent's use of the Lease resource.
type Leases interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error)
	List(ctx context.Context, opts metav1.ListOptions) (*coordinationv1.LeaseList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Create(ctx context.Context, l *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error)
	Update(ctx context.Context, l *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*coordinationv1.Lease, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// PolicyV1 is policy/v1.
type PolicyV1 interface {
	Evictions(namespace string) Evictions
}

// Evictions asks the API server to evict a pod (the pods/eviction
// subresource), which honours PodDisruptionBudgets.
type Evictions interface {
	Evict(ctx context.Context, eviction *policyv1.Eviction) error
}

// ResourceV1 is resource.k8s.io/v1 (DRA).
type ResourceV1 interface {
	ResourceSlices() ResourceSlices
	ResourceClaims(namespace string) Lister[resourcev1.ResourceClaimList]
}

// ResourceV1beta2 is resource.k8s.io/v1beta2.
type ResourceV1beta2 interface {
	ResourceSlices() Lister[resourcev1beta2.ResourceSliceList]
	ResourceClaims(namespace string) Lister[resourcev1beta2.ResourceClaimList]
}

// ResourceV1beta1 is resource.k8s.io/v1beta1.
type ResourceV1beta1 interface {
	ResourceSlices() Lister[resourcev1beta1.ResourceSliceList]
	ResourceClaims(namespace string) Lister[resourcev1beta1.ResourceClaimList]
}

// Lister is a resource the agent only lists (L: its list type).
type Lister[L any] interface {
	List(ctx context.Context, opts metav1.ListOptions) (*L, error)
}

// ResourceSlices is the agent's use of the ResourceSlice resource.
type ResourceSlices = Lister[resourcev1.ResourceSliceList]
