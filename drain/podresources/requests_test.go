package podresources

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestRequestsGPU(t *testing.T) {
	rl := func(name string) corev1.ResourceList {
		return corev1.ResourceList{corev1.ResourceName(name): resource.MustParse("1")}
	}
	tests := []struct {
		name string
		spec corev1.PodSpec
		want bool
	}{
		{"cpu only", corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Requests: rl("cpu")}}}}, false},
		{"gpu limit", corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: rl("nvidia.com/gpu")}}}}, true},
		{"mig request", corev1.PodSpec{Containers: []corev1.Container{{}, {Resources: corev1.ResourceRequirements{Requests: rl("nvidia.com/mig-1g.18gb")}}}}, true},
		{"init container", corev1.PodSpec{InitContainers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: rl("nvidia.com/gpu")}}}}, true},
		{"pod level", corev1.PodSpec{Resources: &corev1.ResourceRequirements{Limits: rl("nvidia.com/gpu")}}, true},
		{"other vendor", corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: rl("amd.com/gpu")}}}}, false},
	}
	for _, tc := range tests {
		if got := RequestsGPU(&corev1.Pod{Spec: tc.spec}); got != tc.want {
			t.Errorf("%s: RequestsGPU = %v, want %v", tc.name, got, tc.want)
		}
	}
}
