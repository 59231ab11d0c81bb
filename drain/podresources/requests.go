package podresources

import corev1 "k8s.io/api/core/v1"

// RequestsGPU reports whether pod requests (or limits) one of the device
// plugin's GPU resources (IsGPUResource) in any container, init container
// or at pod level; a pod on NVIDIA's NICs alone (nvidia.com/hostdev) does
// not. The agent's drain and the planner take a pod for a GPU user by it:
// one rule, read from the pod's spec where PodResources cannot be asked.
func RequestsGPU(pod *corev1.Pod) bool {
	has := func(r corev1.ResourceRequirements) bool {
		for _, l := range []corev1.ResourceList{r.Requests, r.Limits} {
			for name := range l {
				if IsGPUResource(string(name)) {
					return true
				}
			}
		}
		return false
	}
	for _, c := range pod.Spec.InitContainers {
		if has(c.Resources) {
			return true
		}
	}
	for _, c := range pod.Spec.Containers {
		if has(c.Resources) {
			return true
		}
	}
	return pod.Spec.Resources != nil && has(*pod.Spec.Resources)
}
