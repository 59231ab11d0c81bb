package geometry

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// What NVIDIA's DRA driver can announce. Its kubelet plugin
// (github.com/NVIDIA/k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin/nvlib.go)
// knows a MIG device only by a profile of its own list, which getGpuInfo
// builds from every GPU instance profile with one compute instance
// profile: the one that fills the GPU instance (`if
// migProfile.GetInfo().G != migProfile.GetInfo().C { continue }`).
// getMigDevices walks the GPU's MIG devices (its compute instances) and
// fails, and the plugin with it, on a compute instance smaller than its GPU
// instance ("error getting profile info for MIG device"); a GPU instance
// with no compute instance is no MIG device, so it is never announced.

// ErrDRAUnannounced: the geometry holds instances NVIDIA's DRA driver
// cannot announce.
var ErrDRAUnannounced = errors.New("NVIDIA's DRA driver announces only GPU instances that hold exactly one compute instance filling them " +
	"(its kubelet plugin exits at start on a smaller compute instance, and never announces a GPU instance without one)")

// CheckDRA says whether every GPU the plan changes ends with a geometry
// NVIDIA's DRA driver can announce: each GPU instance with exactly one
// compute instance, of its own size. The error names the instances that
// are not.
func CheckDRA(plan *Plan) error {
	var bad []string
	for _, gp := range plan.GPUs {
		if gp.Action == ActionUntouched || !gp.MigEnabled {
			continue
		}
		for _, in := range gp.Desired {
			if cis := computeOf(in); !slices.Equal(cis, []string{canonical(in.Profile)}) {
				bad = append(bad, fmt.Sprintf("GPU %d: %s", gp.Index, in.Name()))
			}
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: %s", ErrDRAUnannounced, strings.Join(bad, ", "))
	}
	return nil
}
