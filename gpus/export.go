package gpus

import (
	"fmt"
	"strings"

	"github.com/migagent/mig-agent/geometry"
)

// ExportName is the config name `mig-agent export` writes unless told
// another (nvidia-mig-parted export's default label).
const ExportName = "current"

// Export renders the node's current geometry as a config file holding one
// config, name, that `apply -c name` reproduces: GPUs with the same
// geometry share one entry. GPUs that cannot do MIG are left out.
func (n *Inventory) Export(name string) *geometry.Spec {
	var entries []geometry.Entry
	index := map[string]int{} // geometry key → entry
	for _, g := range n.GPUs {
		if !g.MigCapable {
			continue
		}
		enabled := g.ModePending // the mode the GPU is headed for
		var counts []geometry.DeviceCount
		if enabled {
			// One count per compute instance, by its profile, as
			// nvidia-mig-parted's export (GetMigConfig) counts them: apply
			// packs them back into shared GPU instances. A GPU instance
			// without compute instances exposes nothing and is left out.
			for _, in := range g.Instances {
				for _, ci := range in.Compute {
					counts = addCount(counts, ci, 1)
				}
			}
		}
		key := fmt.Sprint(enabled, counts)
		if i, ok := index[key]; ok {
			entries[i].Devices.Indices = append(entries[i].Devices.Indices, g.Index)
			continue
		}
		index[key] = len(entries)
		entries = append(entries, geometry.Entry{
			Devices:    geometry.DeviceSelector{Indices: []int{g.Index}},
			MigEnabled: enabled,
			MigDevices: counts,
		})
	}
	return &geometry.Spec{Version: "v1", Names: []string{name}, Configs: map[string][]geometry.Entry{name: entries}}
}

func addCount(c []geometry.DeviceCount, name string, n int) []geometry.DeviceCount {
	for i := range c {
		if strings.EqualFold(c[i].Profile, name) {
			c[i].Count += n
			return c
		}
	}
	return append(c, geometry.DeviceCount{Profile: name, Count: n})
}
