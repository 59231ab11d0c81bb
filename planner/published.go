package planner

import (
	"context"
	"fmt"
	"strings"

	"github.com/migagent/mig-agent/geometry"
	"github.com/migagent/mig-agent/internal/kclient"
	"github.com/migagent/mig-agent/published"
	"github.com/migagent/mig-agent/record"
)

// Record geometry entries that are no instance (gpus.Inventory.GeometryOf).
const (
	geoMigDisabled = "mig-disabled"
	geoNoMig       = "no-mig"
	geoUnusable    = "unusable:"
)

// publishedGPUs reads the GPUs the node's agent discovered through NVML and
// published (the ConfigMap <node>-mig-config in namespace, annotation migagent.io/gpus):
// the models, profiles and placements are the node's own, whatever GPU
// Feature Discovery says or the built-in table knows. The geometry (MIG
// mode and instances) is the agent's newest change record that has one
// (on the Node, which only that node's agent may write), else the
// published one. GFD's nvidia.com/gpu.product, where
// set, only confirms: a model it does not name gives a note (note), and
// the agent's word stands.
func publishedGPUs(ctx context.Context, c kclient.Interface, namespace, node string, labels map[string]string, st published.Node) ([]geometry.GPU, string, error) {
	doc, gpus, err := published.GPUs(ctx, c, namespace, node)
	if err != nil {
		return nil, "", err
	}
	if len(doc.Unusable) > 0 {
		return nil, "", fmt.Errorf("its agent cannot open GPU(s) %v", doc.Unusable)
	}
	if st.GeometryAt != nil {
		if err := overlay(gpus, st.Geometry); err != nil {
			return nil, "", err
		}
	}
	return gpus, confirm(labels[LabelGPUProduct], gpus), nil
}

// overlay sets the MIG mode and the instances of gpus from a change
// record's geometry, newer than what was published.
func overlay(gpus []geometry.GPU, geo []record.GPUGeometry) error {
	for _, g := range geo {
		if g.Index < 0 || g.Index >= len(gpus) {
			return fmt.Errorf("recorded geometry names GPU %d of %d", g.Index, len(gpus))
		}
		gpu := &gpus[g.Index]
		switch {
		case len(g.Instances) == 1 && g.Instances[0] == geoNoMig:
			continue
		case len(g.Instances) == 1 && g.Instances[0] == geoMigDisabled:
			gpu.ModeCurrent, gpu.ModePending, gpu.Instances = false, false, nil
			continue
		case len(g.Instances) == 1 && strings.HasPrefix(g.Instances[0], geoUnusable):
			return fmt.Errorf("GPU %d was unusable at the last change (%s)", g.Index, g.Instances[0])
		}
		gpu.ModeCurrent, gpu.ModePending, gpu.Instances = true, true, nil
		for _, s := range g.Instances {
			in, err := ParseInstance(s)
			if err != nil {
				return fmt.Errorf("recorded geometry of GPU %d: %w", g.Index, err)
			}
			gpu.Instances = append(gpu.Instances, in)
		}
	}
	return nil
}

// confirm compares GPU Feature Discovery's product label with the models
// the agent published: "" when it is unset or names one of them.
func confirm(product string, gpus []geometry.GPU) string {
	if product == "" {
		return ""
	}
	base, _, _ := strings.Cut(product, "-MIG-")
	base = strings.TrimSuffix(base, "-SHARED")
	var names []string
	for _, g := range gpus {
		if strings.ReplaceAll(g.Name, " ", "-") == base {
			return ""
		}
		names = append(names, g.Name)
	}
	return fmt.Sprintf("GPU Feature Discovery's %s=%s names none of the GPUs its agent reports (%s): planned from the agent's",
		LabelGPUProduct, product, strings.Join(names, ", "))
}
