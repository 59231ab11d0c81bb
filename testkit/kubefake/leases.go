// Package kubefake holds test helpers over client-go's fake clientset. It is
// apart from testsupport so that the reconcile core's tests link nothing
// of Kubernetes (reconcile/deps_test.go).
package kubefake

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// LeaseRequests counts the requests on Leases named name, by verb, from
// the fake clientset's action log (watches and lists excluded: they name
// no object).
func LeaseRequests(c *fake.Clientset, name string) map[string]int {
	n := map[string]int{}
	for _, a := range c.Actions() {
		if a.GetResource().Resource != "leases" {
			continue
		}
		switch x := a.(type) {
		case k8stesting.PatchAction: // before GetAction: it has GetName too
			if x.GetName() == name {
				n[a.GetVerb()]++
			}
		case k8stesting.GetAction:
			if x.GetName() == name {
				n[a.GetVerb()]++
			}
		case k8stesting.UpdateAction: // creates too: the same methods
			if x.GetObject().(metav1.Object).GetName() == name {
				n[a.GetVerb()]++
			}
		}
	}
	return n
}
