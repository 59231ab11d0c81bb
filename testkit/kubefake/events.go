package kubefake

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// NameEvents names the Events created through c from their generateName,
// as the API server does (the fake does not: a second Event of the same
// namespace would find the first under the empty name). internal/kevent
// posts every Event with a generateName.
func NameEvents(c *fake.Clientset) {
	seq := 0
	c.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if ev, ok := a.(k8stesting.CreateAction).GetObject().(*corev1.Event); ok && ev.Name == "" {
			seq++
			ev.Name = fmt.Sprintf("%s%d", ev.GenerateName, seq)
		}
		return false, nil, nil
	})
}
