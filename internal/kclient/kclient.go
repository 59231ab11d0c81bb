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
// package kclient/clientset.
package kclient

import (
	"context"
	"fmt"
	"net/http"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourcev1 "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/gentype"
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

// Scheme holds the API types of the groups above, and only those.
var Scheme = runtime.NewScheme()

// codecs and parameterCodec encode and decode with Scheme.
var (
	codecs         = serializer.NewCodecFactory(Scheme)
	parameterCodec = runtime.NewParameterCodec(Scheme)
)

func init() {
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, coordinationv1.AddToScheme,
		policyv1.AddToScheme, resourcev1.AddToScheme, resourcev1beta2.AddToScheme, resourcev1beta1.AddToScheme} {
		if err := add(Scheme); err != nil {
			panic(fmt.Sprintf("kclient scheme: %v", err))
		}
	}
}

// client is Interface over one REST client per group, sharing one HTTP
// client (connection pool), as kubernetes.NewForConfig shares it.
type client struct {
	core, coordination, policy, resource, resourceV1beta2, resourceV1beta1 rest.Interface
}

// New returns the client for cfg.
func New(cfg *rest.Config) (Interface, error) {
	cfgCopy := *cfg
	if cfgCopy.UserAgent == "" {
		cfgCopy.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	hc, err := rest.HTTPClientFor(&cfgCopy)
	if err != nil {
		return nil, err
	}
	c := &client{}
	for _, g := range []struct {
		rc      *rest.Interface
		gv      schema.GroupVersion
		apiPath string
	}{
		{&c.core, corev1.SchemeGroupVersion, "/api"},
		{&c.coordination, coordinationv1.SchemeGroupVersion, "/apis"},
		{&c.policy, policyv1.SchemeGroupVersion, "/apis"},
		{&c.resource, resourcev1.SchemeGroupVersion, "/apis"},
		{&c.resourceV1beta2, resourcev1beta2.SchemeGroupVersion, "/apis"},
		{&c.resourceV1beta1, resourcev1beta1.SchemeGroupVersion, "/apis"},
	} {
		if *g.rc, err = groupClient(&cfgCopy, hc, g.gv, g.apiPath); err != nil {
			return nil, fmt.Errorf("client for %s: %w", g.gv, err)
		}
	}
	return c, nil
}

// groupClient is the REST client of one group version, configured as the
// generated group clients' setConfigDefaults does.
func groupClient(cfg *rest.Config, hc *http.Client, gv schema.GroupVersion, apiPath string) (rest.Interface, error) {
	c := *cfg
	c.GroupVersion = &gv
	c.APIPath = apiPath
	c.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(Scheme, codecs).WithoutConversion()
	return rest.RESTClientForConfigAndClient(&c, hc)
}

func (c *client) CoreV1() CoreV1                   { return coreV1{c.core} }
func (c *client) CoordinationV1() CoordinationV1   { return coordinationV1{c.coordination} }
func (c *client) PolicyV1() PolicyV1               { return policyV1{c.policy} }
func (c *client) ResourceV1() ResourceV1           { return resourceV1{c.resource} }
func (c *client) ResourceV1beta2() ResourceV1beta2 { return resourceV1beta2{c.resourceV1beta2} }
func (c *client) ResourceV1beta1() ResourceV1beta1 { return resourceV1beta1{c.resourceV1beta1} }

type coreV1 struct{ rc rest.Interface }

func (g coreV1) RESTClient() rest.Interface { return g.rc }

func (g coreV1) Nodes() Nodes {
	return gentype.NewClientWithList("nodes", g.rc, parameterCodec, "",
		func() *corev1.Node { return &corev1.Node{} }, func() *corev1.NodeList { return &corev1.NodeList{} },
		gentype.PrefersProtobuf[*corev1.Node]())
}

func (g coreV1) Pods(namespace string) Pods {
	return gentype.NewClientWithList("pods", g.rc, parameterCodec, namespace,
		func() *corev1.Pod { return &corev1.Pod{} }, func() *corev1.PodList { return &corev1.PodList{} },
		gentype.PrefersProtobuf[*corev1.Pod]())
}

func (g coreV1) ConfigMaps(namespace string) ConfigMaps {
	return gentype.NewClient("configmaps", g.rc, parameterCodec, namespace,
		func() *corev1.ConfigMap { return &corev1.ConfigMap{} }, gentype.PrefersProtobuf[*corev1.ConfigMap]())
}

func (g coreV1) Events(namespace string) Events {
	return gentype.NewClient("events", g.rc, parameterCodec, namespace,
		func() *corev1.Event { return &corev1.Event{} }, gentype.PrefersProtobuf[*corev1.Event]())
}

type coordinationV1 struct{ rc rest.Interface }

func (g coordinationV1) Leases(namespace string) Leases {
	return gentype.NewClientWithList("leases", g.rc, parameterCodec, namespace,
		func() *coordinationv1.Lease { return &coordinationv1.Lease{} },
		func() *coordinationv1.LeaseList { return &coordinationv1.LeaseList{} },
		gentype.PrefersProtobuf[*coordinationv1.Lease]())
}

type policyV1 struct{ rc rest.Interface }

func (g policyV1) Evictions(string) Evictions { return evictions(g) }

// evictions posts to pods/eviction under /api/v1 with the policy/v1 client,
// as client-go's typed/policy/v1 eviction_expansion.go does.
type evictions struct{ rc rest.Interface }

func (e evictions) Evict(ctx context.Context, eviction *policyv1.Eviction) error {
	return e.rc.Post().AbsPath("/api/v1").Namespace(eviction.Namespace).Resource("pods").
		Name(eviction.Name).SubResource("eviction").Body(eviction).Do(ctx).Error()
}

type resourceV1 struct{ rc rest.Interface }

func (g resourceV1) ResourceSlices() ResourceSlices {
	return gentype.NewClientWithList("resourceslices", g.rc, parameterCodec, "",
		func() *resourcev1.ResourceSlice { return &resourcev1.ResourceSlice{} },
		func() *resourcev1.ResourceSliceList { return &resourcev1.ResourceSliceList{} },
		gentype.PrefersProtobuf[*resourcev1.ResourceSlice]())
}

func (g resourceV1) ResourceClaims(namespace string) Lister[resourcev1.ResourceClaimList] {
	return gentype.NewClientWithList("resourceclaims", g.rc, parameterCodec, namespace,
		func() *resourcev1.ResourceClaim { return &resourcev1.ResourceClaim{} },
		func() *resourcev1.ResourceClaimList { return &resourcev1.ResourceClaimList{} },
		gentype.PrefersProtobuf[*resourcev1.ResourceClaim]())
}

type resourceV1beta2 struct{ rc rest.Interface }

func (g resourceV1beta2) ResourceSlices() Lister[resourcev1beta2.ResourceSliceList] {
	return gentype.NewClientWithList("resourceslices", g.rc, parameterCodec, "",
		func() *resourcev1beta2.ResourceSlice { return &resourcev1beta2.ResourceSlice{} },
		func() *resourcev1beta2.ResourceSliceList { return &resourcev1beta2.ResourceSliceList{} },
		gentype.PrefersProtobuf[*resourcev1beta2.ResourceSlice]())
}

func (g resourceV1beta2) ResourceClaims(namespace string) Lister[resourcev1beta2.ResourceClaimList] {
	return gentype.NewClientWithList("resourceclaims", g.rc, parameterCodec, namespace,
		func() *resourcev1beta2.ResourceClaim { return &resourcev1beta2.ResourceClaim{} },
		func() *resourcev1beta2.ResourceClaimList { return &resourcev1beta2.ResourceClaimList{} },
		gentype.PrefersProtobuf[*resourcev1beta2.ResourceClaim]())
}

type resourceV1beta1 struct{ rc rest.Interface }

func (g resourceV1beta1) ResourceSlices() Lister[resourcev1beta1.ResourceSliceList] {
	return gentype.NewClientWithList("resourceslices", g.rc, parameterCodec, "",
		func() *resourcev1beta1.ResourceSlice { return &resourcev1beta1.ResourceSlice{} },
		func() *resourcev1beta1.ResourceSliceList { return &resourcev1beta1.ResourceSliceList{} },
		gentype.PrefersProtobuf[*resourcev1beta1.ResourceSlice]())
}

func (g resourceV1beta1) ResourceClaims(namespace string) Lister[resourcev1beta1.ResourceClaimList] {
	return gentype.NewClientWithList("resourceclaims", g.rc, parameterCodec, namespace,
		func() *resourcev1beta1.ResourceClaim { return &resourcev1beta1.ResourceClaim{} },
		func() *resourcev1beta1.ResourceClaimList { return &resourcev1beta1.ResourceClaimList{} },
		gentype.PrefersProtobuf[*resourcev1beta1.ResourceClaim]())
}
