// Package clientset fits a client-go clientset (the generated one, or its
// fake) to kclient.Interface, for tests that drive the agent's Kubernetes
// code with a clientset. The agent itself never imports it: it would link
// every API group again (kclient's package doc).
package clientset

import (
	apiresourcev1 "k8s.io/api/resource/v1"
	apiresourcev1beta1 "k8s.io/api/resource/v1beta1"
	apiresourcev1beta2 "k8s.io/api/resource/v1beta2"
	"k8s.io/client-go/kubernetes"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	policyv1 "k8s.io/client-go/kubernetes/typed/policy/v1"
	resourcev1 "k8s.io/client-go/kubernetes/typed/resource/v1"
	resourcev1beta1 "k8s.io/client-go/kubernetes/typed/resource/v1beta1"
	resourcev1beta2 "k8s.io/client-go/kubernetes/typed/resource/v1beta2"
	"k8s.io/client-go/rest"

	"github.com/migagent/mig-agent/internal/kclient"
)

// Wrap returns c as a kclient.Interface.
func Wrap(c kubernetes.Interface) kclient.Interface { return wrapped{c} }

type wrapped struct{ c kubernetes.Interface }

func (w wrapped) CoreV1() kclient.CoreV1                 { return core{w.c.CoreV1()} }
func (w wrapped) CoordinationV1() kclient.CoordinationV1 { return coordination{w.c.CoordinationV1()} }
func (w wrapped) PolicyV1() kclient.PolicyV1             { return policy{w.c.PolicyV1()} }
func (w wrapped) ResourceV1() kclient.ResourceV1         { return resource{w.c.ResourceV1()} }
func (w wrapped) ResourceV1beta2() kclient.ResourceV1beta2 {
	return resourceBeta2{w.c.ResourceV1beta2()}
}
func (w wrapped) ResourceV1beta1() kclient.ResourceV1beta1 {
	return resourceBeta1{w.c.ResourceV1beta1()}
}

// IsWatchListSemanticsUnSupported passes on what the clientset says of the
// watch-list protocol (a fake one does not support it), for informers.
func (w wrapped) IsWatchListSemanticsUnSupported() bool {
	u, ok := w.c.(interface{ IsWatchListSemanticsUnSupported() bool })
	return ok && u.IsWatchListSemanticsUnSupported()
}

type core struct{ c corev1.CoreV1Interface }

func (g core) RESTClient() rest.Interface              { return g.c.RESTClient() }
func (g core) Nodes() kclient.Nodes                    { return g.c.Nodes() }
func (g core) Pods(ns string) kclient.Pods             { return g.c.Pods(ns) }
func (g core) ConfigMaps(ns string) kclient.ConfigMaps { return g.c.ConfigMaps(ns) }
func (g core) Events(ns string) kclient.Events         { return g.c.Events(ns) }

type coordination struct {
	c coordinationv1.CoordinationV1Interface
}

func (g coordination) Leases(ns string) kclient.Leases { return g.c.Leases(ns) }

type policy struct{ c policyv1.PolicyV1Interface }

func (g policy) Evictions(ns string) kclient.Evictions { return g.c.Evictions(ns) }

type resource struct {
	c resourcev1.ResourceV1Interface
}

func (g resource) ResourceSlices() kclient.ResourceSlices { return g.c.ResourceSlices() }
func (g resource) ResourceClaims(ns string) kclient.Lister[apiresourcev1.ResourceClaimList] {
	return g.c.ResourceClaims(ns)
}

type resourceBeta2 struct {
	c resourcev1beta2.ResourceV1beta2Interface
}

func (g resourceBeta2) ResourceSlices() kclient.Lister[apiresourcev1beta2.ResourceSliceList] {
	return g.c.ResourceSlices()
}
func (g resourceBeta2) ResourceClaims(ns string) kclient.Lister[apiresourcev1beta2.ResourceClaimList] {
	return g.c.ResourceClaims(ns)
}

type resourceBeta1 struct {
	c resourcev1beta1.ResourceV1beta1Interface
}

func (g resourceBeta1) ResourceSlices() kclient.Lister[apiresourcev1beta1.ResourceSliceList] {
	return g.c.ResourceSlices()
}
func (g resourceBeta1) ResourceClaims(ns string) kclient.Lister[apiresourcev1beta1.ResourceClaimList] {
	return g.c.ResourceClaims(ns)
}
