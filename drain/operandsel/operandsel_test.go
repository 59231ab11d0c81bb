package operandsel

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// A pod wearing the device plugin's labels is the device plugin only as a
// DaemonSet's pod in an operand namespace; the others are impostors,
// named with why.
func TestVet(t *testing.T) {
	s, err := ParseSelectors(nil, []string{"app=mig-reader"})
	if err != nil {
		t.Fatal(err)
	}
	s.Within(OperandNamespaces(nil, "mig-agent"))
	ds := []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "d", UID: "u", Controller: ptr.To(true)}}
	pod := func(ns, name, app string, owners []metav1.OwnerReference) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": app}, OwnerReferences: owners}}
	}
	real := pod("kube-system", "dp", "nvidia-device-plugin-daemonset", ds)
	reader := pod("mig-agent", "reader", "mig-reader", ds)
	tenant := pod("team-a", "dp", "nvidia-device-plugin-daemonset", ds)
	bareReader := pod("mig-agent", "bare", "mig-reader", nil)
	if s.RoleOf(&real) != OperandDevicePlugin || !s.Restarted(&real) || !s.Restarted(&reader) {
		t.Errorf("the true operands are not taken")
	}
	if s.RoleOf(&tenant) != "" || s.Restarted(&tenant) || s.Restarted(&bareReader) {
		t.Errorf("an impostor is taken")
	}
	bad := s.Impostors([]corev1.Pod{real, reader, tenant, bareReader})
	if len(bad) != 2 || !strings.HasPrefix(bad[0], "mig-agent/bare (selected as plugin-selector; not controlled by a DaemonSet)") ||
		!strings.HasPrefix(bad[1], "team-a/dp (selected as device-plugin; namespace team-a is not an operand namespace") {
		t.Errorf("Impostors = %q", bad)
	}
	if got := OperandNamespaces([]string{"ops"}, "mig-agent"); !slices.Equal(got, []string{"ops"}) {
		t.Errorf("named namespaces = %v", got)
	}
}
