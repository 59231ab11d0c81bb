package track

import (
	"context"
	"fmt"

	"github.com/migagent/mig-agent/nvmlx"
)

// HostNamespace is the namespace of the trail's entries of a standalone
// agent: processes of the host, not pods.
const HostNamespace = "host"

// Processes is the Source of a host without Kubernetes: the processes NVML
// reports on each MIG device. An entry's pod is the process name, its
// container "pid:N" (a process is known by its id while it runs). NVML is
// opened for each poll (one session, closed again), so the agent still
// holds no NVML session between polls.
type Processes struct {
	GPU nvmlx.GPU
}

var _ Source = (*Processes)(nil)

// Held implements Source.
func (p *Processes) Held(context.Context) ([]Held, error) {
	if err := p.GPU.Begin(); err != nil {
		return nil, err
	}
	defer p.GPU.End()
	devs, _, err := nvmlx.SplitUnusable(p.GPU.Devices())
	if err != nil {
		return nil, err
	}
	var out []Held
	for _, d := range devs {
		if !d.MigCapable || !d.MigMode.Current {
			continue
		}
		insts, err := p.GPU.Instances(d.Index)
		if err != nil {
			return nil, err
		}
		procs, err := p.GPU.Processes(d.Index)
		if err != nil {
			return nil, err
		}
		for _, pr := range procs {
			uuid := migUUID(insts, pr.GIID, pr.CIID)
			if uuid == "" {
				continue
			}
			name := pr.Name
			if name == "" {
				name = "unknown"
			}
			out = append(out, Held{Namespace: HostNamespace, Pod: name, Container: fmt.Sprintf("pid:%d", pr.PID),
				Resource: "process", ID: uuid})
		}
	}
	return out, nil
}

// migUUID is the MIG device of compute instance ci in GPU instance gi
// ("" where there is none).
func migUUID(insts []nvmlx.GPUInstance, gi, ci int) string {
	for _, g := range insts {
		if g.ID != gi {
			continue
		}
		for _, c := range g.ComputeInstances {
			if c.ID == ci {
				return c.UUID
			}
		}
	}
	return ""
}
