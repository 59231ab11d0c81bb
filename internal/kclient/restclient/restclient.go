// Package restclient is the client of kclient's interfaces: one REST
// client per API group the agent calls, each resource client-go's own
// generic client (k8s.io/client-go/gentype) as the generated clients build
// them, over a scheme that holds only those groups' types. Only main and
// the tests that talk to a real API server build one; everything else
// takes a kclient.Interface.
package restclient

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
	"k8s.io/client-go/gentype"
	"k8s.io/client-go/rest"

	"github.com/migagent/mig-agent/internal/kclient"
)

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

// client is kclient.Interface over one REST client per group, sharing one HTTP
// client (connection pool), as kubernetes.NewForConfig shares it.
var _ kclient.Interface = (*client)(nil)

type client struct {
	core, coordination, policy, resource, resourceV1beta2, resourceV1beta1 rest.Interface
}

// New returns the client for cfg.
func New(cfg *rest.Config) (kclient.Interface, error) {
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

func (c *client) CoreV1() kclient.CoreV1                   { return coreV1{c.core} }
func (c *client) CoordinationV1() kclient.CoordinationV1   { return coordinationV1{c.coordination} }
func (c *client) PolicyV1() kclient.PolicyV1               { return policyV1{c.policy} }
func (c *client) ResourceV1() kclient.ResourceV1           { return resourceV1{c.resource} }
func (c *client) ResourceV1beta2() kclient.ResourceV1beta2 { return resourceV1beta2{c.resourceV1beta2} }
func (c *client) ResourceV1beta1() kclient.ResourceV1beta1 { return resourceV1beta1{c.resourceV1beta1} }

type coreV1 struct{ rc rest.Interface }

func (g coreV1) RESTClient() rest.Interface { return g.rc }

func (g coreV1) Nodes() kclient.Nodes {
	return gentype.NewClientWithList("nodes", g.rc, parameterCodec, "",
		func() *corev1.Node { return &corev1.Node{} }, func() *corev1.NodeList { return &corev1.NodeList{} },
		gentype.PrefersProtobuf[*corev1.Node]())
}

func (g coreV1) Pods(namespace string) kclient.Pods {
	return gentype.NewClientWithList("pods", g.rc, parameterCodec, namespace,
		func() *corev1.Pod { return &corev1.Pod{} }, func() *corev1.PodList { return &corev1.PodList{} },
		gentype.PrefersProtobuf[*corev1.Pod]())
}

func (g coreV1) ConfigMaps(namespace string) kclient.ConfigMaps {
	return gentype.NewClient("configmaps", g.rc, parameterCodec, namespace,
		func() *corev1.ConfigMap { return &corev1.ConfigMap{} }, gentype.PrefersProtobuf[*corev1.ConfigMap]())
}

func (g coreV1) Events(namespace string) kclient.Events {
	return gentype.NewClient("events", g.rc, parameterCodec, namespace,
		func() *corev1.Event { return &corev1.Event{} }, gentype.PrefersProtobuf[*corev1.Event]())
}

type coordinationV1 struct{ rc rest.Interface }

func (g coordinationV1) Leases(namespace string) kclient.Leases {
	return gentype.NewClientWithList("leases", g.rc, parameterCodec, namespace,
		func() *coordinationv1.Lease { return &coordinationv1.Lease{} },
		func() *coordinationv1.LeaseList { return &coordinationv1.LeaseList{} },
		gentype.PrefersProtobuf[*coordinationv1.Lease]())
}

type policyV1 struct{ rc rest.Interface }

func (g policyV1) Evictions(string) kclient.Evictions { return evictions(g) }

// evictions posts to pods/eviction under /api/v1 with the policy/v1 client,
// as client-go's typed/policy/v1 eviction_expansion.go does.
type evictions struct{ rc rest.Interface }

func (e evictions) Evict(ctx context.Context, eviction *policyv1.Eviction) error {
	return e.rc.Post().AbsPath("/api/v1").Namespace(eviction.Namespace).Resource("pods").
		Name(eviction.Name).SubResource("eviction").Body(eviction).Do(ctx).Error()
}

type resourceV1 struct{ rc rest.Interface }

func (g resourceV1) ResourceSlices() kclient.ResourceSlices {
	return gentype.NewClientWithList("resourceslices", g.rc, parameterCodec, "",
		func() *resourcev1.ResourceSlice { return &resourcev1.ResourceSlice{} },
		func() *resourcev1.ResourceSliceList { return &resourcev1.ResourceSliceList{} },
		gentype.PrefersProtobuf[*resourcev1.ResourceSlice]())
}

func (g resourceV1) ResourceClaims(namespace string) kclient.Lister[resourcev1.ResourceClaimList] {
	return gentype.NewClientWithList("resourceclaims", g.rc, parameterCodec, namespace,
		func() *resourcev1.ResourceClaim { return &resourcev1.ResourceClaim{} },
		func() *resourcev1.ResourceClaimList { return &resourcev1.ResourceClaimList{} },
		gentype.PrefersProtobuf[*resourcev1.ResourceClaim]())
}

type resourceV1beta2 struct{ rc rest.Interface }

func (g resourceV1beta2) ResourceSlices() kclient.Lister[resourcev1beta2.ResourceSliceList] {
	return gentype.NewClientWithList("resourceslices", g.rc, parameterCodec, "",
		func() *resourcev1beta2.ResourceSlice { return &resourcev1beta2.ResourceSlice{} },
		func() *resourcev1beta2.ResourceSliceList { return &resourcev1beta2.ResourceSliceList{} },
		gentype.PrefersProtobuf[*resourcev1beta2.ResourceSlice]())
}

func (g resourceV1beta2) ResourceClaims(namespace string) kclient.Lister[resourcev1beta2.ResourceClaimList] {
	return gentype.NewClientWithList("resourceclaims", g.rc, parameterCodec, namespace,
		func() *resourcev1beta2.ResourceClaim { return &resourcev1beta2.ResourceClaim{} },
		func() *resourcev1beta2.ResourceClaimList { return &resourcev1beta2.ResourceClaimList{} },
		gentype.PrefersProtobuf[*resourcev1beta2.ResourceClaim]())
}

type resourceV1beta1 struct{ rc rest.Interface }

func (g resourceV1beta1) ResourceSlices() kclient.Lister[resourcev1beta1.ResourceSliceList] {
	return gentype.NewClientWithList("resourceslices", g.rc, parameterCodec, "",
		func() *resourcev1beta1.ResourceSlice { return &resourcev1beta1.ResourceSlice{} },
		func() *resourcev1beta1.ResourceSliceList { return &resourcev1beta1.ResourceSliceList{} },
		gentype.PrefersProtobuf[*resourcev1beta1.ResourceSlice]())
}

func (g resourceV1beta1) ResourceClaims(namespace string) kclient.Lister[resourcev1beta1.ResourceClaimList] {
	return gentype.NewClientWithList("resourceclaims", g.rc, parameterCodec, namespace,
		func() *resourcev1beta1.ResourceClaim { return &resourcev1beta1.ResourceClaim{} },
		func() *resourcev1beta1.ResourceClaimList { return &resourcev1beta1.ResourceClaimList{} },
		gentype.PrefersProtobuf[*resourcev1beta1.ResourceClaim]())
}
