package nvmlsim

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migagent/mig-agent/nvmlx/nvmlreturn"
	"github.com/migagent/mig-agent/profiles"
)

// Sentinel errors of the simulator's inputs; every error New returns for
// bad input wraps one of them.
var (
	// ErrBadSpec: the sim:SPEC is malformed or names an unknown model.
	ErrBadSpec = errors.New("invalid simulator spec")
	// ErrBadFaults: the --sim-faults SPEC is malformed.
	ErrBadFaults = errors.New("invalid simulator faults")
	// ErrState: the --sim-state file cannot be used (unreadable, corrupt,
	// or holding other GPUs than the spec).
	ErrState = errors.New("unusable simulator state")
)

// maxSimGPUs bounds a spec; real nodes hold at most 8 or 16 GPUs.
const maxSimGPUs = 64

// Operation names the simulator uses in Error.Op, Mutations and
// --sim-faults: go-nvml's method names, with the receiver where two share a
// name. For --sim-faults, OpCreateGpuInstance and
// OpCreateGpuInstanceWithPlacement both name every GPU instance creation
// (mig-agent's CreateGPUInstance always passes a placement; NVIDIA's
// mig-parted lets the driver place), so a fault on either counts the same
// calls; Mutations counts each NVML function under its own name.
const (
	OpCreateGpuInstance              = "CreateGpuInstance"
	OpCreateGpuInstanceWithPlacement = "CreateGpuInstanceWithPlacement"
	OpCreateComputeInstance          = "CreateComputeInstance"
	OpGpuInstanceDestroy             = "GpuInstance.Destroy"
	OpComputeInstanceDestroy         = "ComputeInstance.Destroy"
	OpSetMigMode                     = "SetMigMode"
	OpResetGpu                       = "ResetGpu"
	// OpInit is nvmlInit (go-nvml's Init): a fault there is NVML failing
	// to open, as after a reset before the driver has the GPU back.
	OpInit = "Init"
)

// faultOps lists the operations --sim-faults accepts.
func faultOps() []string {
	return []string{OpCreateGpuInstance, OpCreateGpuInstanceWithPlacement, OpCreateComputeInstance,
		OpGpuInstanceDestroy, OpComputeInstanceDestroy, OpSetMigMode, OpResetGpu, OpInit}
}

// knownModelKeys lists the simulator's model keys, sorted.
func knownModelKeys() string {
	var keys []string
	for _, m := range profiles.Models() {
		keys = append(keys, m.Key)
	}
	slices.Sort(keys)
	return strings.Join(keys, ", ")
}

// ParseSpec parses a simulator spec ("h200x8", "a100-40gbx4,h100-80gbx4";
// a leading "sim:" is allowed) into one model per GPU, in GPU index order.
func ParseSpec(spec string) ([]*profiles.Model, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w %q: %s (want MODELxCOUNT[,MODELxCOUNT...], models: %s)",
			ErrBadSpec, spec, fmt.Sprintf(format, a...), knownModelKeys())
	}
	s := strings.TrimPrefix(strings.TrimSpace(spec), "sim:")
	if s == "" {
		return nil, bad("empty")
	}
	var out []*profiles.Model
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		x := strings.LastIndexByte(part, 'x')
		if x <= 0 || x == len(part)-1 {
			return nil, bad("%q has no xCOUNT", part)
		}
		key, num := part[:x], part[x+1:]
		n, err := strconv.Atoi(num)
		if err != nil || n < 1 {
			return nil, bad("count %q in %q is not a positive number", num, part)
		}
		m, ok := profiles.ModelByKey(key)
		if !ok {
			return nil, bad("unknown model %q", key)
		}
		if len(out)+n > maxSimGPUs {
			return nil, bad("more than %d GPUs", maxSimGPUs)
		}
		for range n {
			out = append(out, m)
		}
	}
	return out, nil
}

// specOf writes a model list back as a spec ("h200x2,a30x1").
func specOf(keys []string) string {
	var parts []string
	for i := 0; i < len(keys); {
		j := i
		for j < len(keys) && keys[j] == keys[i] {
			j++
		}
		parts = append(parts, fmt.Sprintf("%sx%d", keys[i], j-i))
		i = j
	}
	return strings.Join(parts, ",")
}

// faultPlan is a parsed --sim-faults: operation → call number → NVML error.
type faultPlan map[string]map[int]string

// parseFaults parses "Op:N=ERROR_NAME,...". The empty string is no faults.
func parseFaults(spec string) (faultPlan, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w %q: %s (want OP:N=ERROR_NAME[,...], operations: %s)",
			ErrBadFaults, spec, fmt.Sprintf(format, a...), strings.Join(faultOps(), ", "))
	}
	plan := faultPlan{}
	if strings.TrimSpace(spec) == "" {
		return plan, nil
	}
	for item := range strings.SplitSeq(spec, ",") {
		item = strings.TrimSpace(item)
		left, name, ok := strings.Cut(item, "=")
		if !ok {
			return nil, bad("%q has no =ERROR_NAME", item)
		}
		c := strings.LastIndexByte(left, ':')
		if c <= 0 {
			return nil, bad("%q has no OP:N", item)
		}
		op, num := left[:c], left[c+1:]
		if !slices.Contains(faultOps(), op) {
			return nil, bad("unknown operation %q", op)
		}
		n, err := strconv.Atoi(num)
		if err != nil || n < 1 {
			return nil, bad("call number %q in %q is not a positive number", num, item)
		}
		if r, ok := nvmlreturn.ByName(name); !ok || r == nvml.SUCCESS {
			return nil, bad("%q is not an NVML error name (like ERROR_IN_USE, ERROR_UNKNOWN)", name)
		}
		if plan[op] == nil {
			plan[op] = map[int]string{}
		}
		if _, dup := plan[op][n]; dup {
			return nil, bad("%s:%d given twice", op, n)
		}
		plan[op][n] = name
	}
	return plan, nil
}
