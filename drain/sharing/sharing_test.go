package sharing

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/testkit/clientset"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes/fake"
)

// nodePods lists the pods on node, as drain.NodePods does (without its
// memo).
func nodePods(ctx context.Context, client kclient.Interface, node string) ([]corev1.Pod, error) {
	list, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("list the pods of node %s: %w", node, err)
	}
	return list.Items, nil
}

// readNodeSharing is ReadNode with nodePods.
func readNodeSharing(ctx context.Context, client kclient.Interface, node string) (*Config, error) {
	return ReadNode(ctx, client, node, nodePods, nil)
}

const timeSlicing4 = `version: v1
sharing:
  timeSlicing:
    resources:
    - name: mig-1g.18gb
      replicas: 4
    - name: nvidia.com/gpu
      replicas: 2
`

func TestParseSharing(t *testing.T) {
	got, err := Parse([]byte(timeSlicing4))
	if err != nil {
		t.Fatal(err)
	}
	want := map[corev1.ResourceName]Replicated{
		"nvidia.com/mig-1g.18gb": {Replicas: 4, As: "nvidia.com/mig-1g.18gb"},
		"nvidia.com/gpu":         {Replicas: 2, As: "nvidia.com/gpu"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseSharing = %v, want %v", got, want)
	}
	// renameByDefault, and "rename" ignored as the plugin does; MPS wins
	// over time-slicing when set.
	got, err = Parse([]byte(`{"version":"v1","sharing":{"timeSlicing":{"resources":[{"name":"nvidia.com/gpu","replicas":9}]},
"mps":{"renameByDefault":true,"resources":[{"name":"nvidia.com/gpu","replicas":3,"rename":"other"}]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := (Replicated{Replicas: 3, As: "nvidia.com/gpu.shared"}); got["nvidia.com/gpu"] != want || len(got) != 1 {
		t.Errorf("ParseSharing(mps, renameByDefault) = %v", got)
	}
	// No sharing section: nothing shared.
	if got, err := Parse([]byte("version: v1\nflags:\n  migStrategy: mixed\n")); err != nil || len(got) != 0 {
		t.Errorf("ParseSharing(no sharing) = %v, %v", got, err)
	}
	for name, bad := range map[string]string{
		"one replica":  "sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 1\n",
		"no replicas":  "sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n",
		"no resources": "sharing:\n  timeSlicing:\n    renameByDefault: true\n",
		"no name":      "sharing:\n  timeSlicing:\n    resources:\n    - replicas: 2\n",
		"not yaml":     "sharing: [",
	} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("ParseSharing(%s) accepted it", name)
		}
	}
}

// pluginPod is a device plugin pod as the GPU Operator deploys it
// (assets/state-device-plugin/0500_daemonset.yaml).
func pluginPod(node, cm, defaultConfig, fallbacks string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "gpu-operator", Name: "nvidia-device-plugin-daemonset-x", Labels: map[string]string{"app": "nvidia-device-plugin-daemonset"}},
		Spec: corev1.PodSpec{
			NodeName: node,
			Containers: []corev1.Container{
				{Name: "nvidia-device-plugin", Env: []corev1.EnvVar{{Name: "CONFIG_FILE", Value: "/config/config.yaml"}}},
				{Name: "config-manager", Env: []corev1.EnvVar{
					{Name: "CONFIG_FILE_SRCDIR", Value: "/available-configs"}, {Name: "DEFAULT_CONFIG", Value: defaultConfig},
					{Name: "FALLBACK_STRATEGIES", Value: fallbacks},
				}, VolumeMounts: []corev1.VolumeMount{{Name: "available-configs", MountPath: "/available-configs"}}},
			},
			Volumes: []corev1.Volume{{Name: "available-configs", VolumeSource: corev1.VolumeSource{
				ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: cm}}}}},
		},
	}
}

func TestReadSharing(t *testing.T) {
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "gpu-operator", Name: "plugin-config"},
		Data: map[string]string{"ts4": timeSlicing4, "plain": "version: v1\n"}}
	node := func(label string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
		if label != "" {
			n.Labels = map[string]string{devicePluginConfigLabel: label}
		}
		return n
	}
	for _, tc := range []struct {
		name            string
		label, def, fbs string
		source          string // "" unknown
		replicas        int64
	}{
		{name: "label", label: "ts4", source: `key "ts4"`, replicas: 4},
		{name: "default", def: "ts4", source: `key "ts4"`, replicas: 4},
		{name: "label over default", label: "plain", def: "ts4", source: `key "plain"`},
		{name: "missing key keeps the old config", label: "gone", def: "ts4"},
		{name: "empty fallback", fbs: "named,empty", source: "empty config"},
		{name: "no fallback", fbs: "named,single"},
	} {
		c := fake.NewClientset(node(tc.label), cm, pluginPod("n1", "plugin-config", tc.def, tc.fbs))
		s, err := readNodeSharing(ctx, clientset.Wrap(c), "n1")
		if tc.source == "" {
			if s != nil || !errors.Is(err, errUnknown) {
				t.Errorf("%s: ReadSharing = %v, %v, want unknown", tc.name, s, err)
			}
			continue
		}
		if err != nil || !strings.Contains(s.Source, tc.source) || s.Resources["nvidia.com/mig-1g.18gb"].Replicas != tc.replicas {
			t.Errorf("%s: ReadSharing = %+v, %v", tc.name, s, err)
		}
	}
	// A plugin without config-manager or config file shares nothing.
	bare := pluginPod("n1", "x", "", "")
	bare.Spec.Containers = bare.Spec.Containers[:1]
	bare.Spec.Containers[0].Env = nil
	if s, err := readNodeSharing(ctx, clientset.Wrap(fake.NewClientset(node(""), bare)), "n1"); s != None || err != nil {
		t.Errorf("ReadSharing(no config) = %v, %v, want NoSharing", s, err)
	}
	// Its own config file (on the host): unknown.
	bare.Spec.Containers[0].Args = []string{"--config-file=/etc/plugin.yaml"}
	if s, err := readNodeSharing(ctx, clientset.Wrap(fake.NewClientset(node(""), bare)), "n1"); s != nil || !errors.Is(err, errUnknown) {
		t.Errorf("ReadSharing(host file) = %v, %v", s, err)
	}
	// No plugin pod; a ConfigMap it may not read (absent here): unknown.
	if _, err := readNodeSharing(ctx, clientset.Wrap(fake.NewClientset(node(""))), "n1"); !errors.Is(err, ErrNoPluginPod) {
		t.Errorf("ReadSharing(no pod) err = %v", err)
	}
	if _, err := readNodeSharing(ctx, clientset.Wrap(fake.NewClientset(node("ts4"), pluginPod("n1", "absent", "", ""))), "n1"); !errors.Is(err, errUnknown) {
		t.Errorf("ReadSharing(no ConfigMap) err = %v", err)
	}
}
