package drain

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/migagent/mig-agent/internal/kclient/clientset"
	"github.com/migagent/mig-agent/internal/testsupport"
	"github.com/migagent/mig-agent/settings"
)

// A renamed device plugin (a self-installed one with its own labels) and
// the DRA driver's kubelet plugin under a chart nameOverride
// ("<nameOverride>-component: kubelet-plugin") are not found by the
// default selectors; --plugin-selector names them, and replaces the
// defaults.
func TestPluginSelectors(t *testing.T) {
	pod := func(name string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "gpu", Name: name, UID: "u-" + "1", Labels: labels},
			Spec: corev1.PodSpec{NodeName: "n1"}}
	}
	c := fake.NewClientset(
		pod("my-plugin", map[string]string{"app": "my-nvidia-plugin"}),
		pod("gpu-dra-kubelet-plugin-x", map[string]string{"gpu-dra-component": "kubelet-plugin"}),
		pod("operator-plugin", map[string]string{"app": "nvidia-device-plugin-daemonset"}),
		pod("workload", map[string]string{"app": "train"}))
	names := func(sel []string) []string {
		t.Helper()
		k := &Disruptor{Client: clientset.Wrap(c), Log: testsupport.Discard(), Node: "n1", Settings: &settings.Settings{PluginSelectors: sel}}
		got, err := k.DevicePlugins(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range got {
			out = append(out, strings.Split(p, "/")[1])
		}
		return out
	}
	if got := names(nil); !slices.Equal(got, []string{"operator-plugin"}) {
		t.Errorf("defaults: %v", got)
	}
	if got := names([]string{"app=my-nvidia-plugin", "gpu-dra-component=kubelet-plugin"}); !slices.Equal(got, []string{"gpu-dra-kubelet-plugin-x", "my-plugin"}) {
		t.Errorf("named: %v", got)
	}
	if got := names([]string{"app in (my-nvidia-plugin, nvidia-device-plugin-daemonset)"}); !slices.Equal(got, []string{"my-plugin", "operator-plugin"}) {
		t.Errorf("set-based: %v", got)
	}
	k := &Disruptor{Client: clientset.Wrap(c), Log: testsupport.Discard(), Node: "n1", Settings: &settings.Settings{PluginSelectors: []string{""}}}
	if _, err := k.DevicePlugins(context.Background()); err == nil {
		t.Error("an empty selector (every pod) accepted")
	}
}
