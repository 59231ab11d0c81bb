package gpus

import (
	"encoding/json"
	"time"

	"github.com/migagent/mig-agent/geometry"
)

// Publication is what the agent publishes of n in its node's ConfigMap:
// the generated configs (key config.yaml) and the GPUs as discovered
// (annotation migagent.io/gpus, geometry.Published, read at at); key is the two without
// the time, which changes only when what they say does.
func (n *Inventory) Publication(at time.Time) (configYAML, gpusJSON, key string, err error) {
	cfg, err := geometry.Generate(n.GPUs).Marshal()
	if err != nil {
		return "", "", "", err
	}
	unusable := make([]int, 0, len(n.Unusable))
	for _, u := range n.Unusable {
		unusable = append(unusable, u.Index)
	}
	same, err := json.Marshal(geometry.Publish(n.GPUs, unusable, time.Time{}))
	if err != nil {
		return "", "", "", err
	}
	doc, err := json.Marshal(geometry.Publish(n.GPUs, unusable, at))
	return string(cfg), string(doc), string(cfg) + string(same), err
}
